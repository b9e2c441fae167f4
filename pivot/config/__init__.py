"""Checks of configured values (``validation``): a leaf that every configurable may
import. Parsing gin files and building the driver they name is ``pivot.gin_setup``."""
