"""Role shifting (sec. 5.2) and the shift executor (sec. 4, "Workflow").

Pure code: no Monarch import. The Monarch edge is ``pivot.runtime``.
"""
