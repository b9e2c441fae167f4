"""What a run is, read by both drivers (the cluster driver and the simulator): the model
group (``model_group``: table 1, table 4) with its models' cost profiles (``profile``,
``roofline``, ``stand_in``) and length distributions (``lengths``), and the deployment
(``deployment``: sec. 8.2). Imports no engine."""
