"""The one thing pyproject.toml cannot yet say without an experimental table: stage 1's C column
loop (fleetmedic/models/_columns.c). Optional: without a C compiler the package installs and runs
the same pure-Python path (fleetmedic.models.sample_columns), slower."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("fleetmedic.models._columns", ["fleetmedic/models/_columns.c"], optional=True)])
