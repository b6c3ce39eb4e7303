"""The one thing pyproject.toml cannot yet say without an experimental table: the C loops of stage 1,
the metric columns (fleetmedic/models/_columns.c) and the GPU detector's signals and baseline
step (fleetmedic/models/_baselines.c), of the remote-write receiver
(fleetmedic/connectors/remote_write/_remote_write.c), of the exposition readers' GPU records
(fleetmedic/connectors/prometheus/_gpu_record.c) and of the what-if replay's scheduler shuffle
(fleetmedic/sim/whatif/_shuffle.c). Optional: without a C compiler the package installs and runs
the same pure-Python / numpy paths (fleetmedic.models.sample_columns, fleetmedic.models.gpu_signals,
fleetmedic.connectors.remote_write.assembler, fleetmedic.connectors.prometheus.text,
fleetmedic.sim.whatif.world), slower."""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("fleetmedic.models._columns", ["fleetmedic/models/_columns.c"], optional=True),
    # no FMA contraction: numpy rounds a * b + c twice, and the loop's results must equal numpy's
    Extension("fleetmedic.models._baselines", ["fleetmedic/models/_baselines.c"], optional=True,
              extra_compile_args=["-ffp-contract=off"]),
    # the remote-write receiver's commonest series (fleetmedic/connectors/remote_write/_remote_write.c)
    Extension("fleetmedic.connectors.remote_write._remote_write", ["fleetmedic/connectors/remote_write/_remote_write.c"],
              optional=True),
    # the common columns of a GPU record, shared by every exposition path
    # (fleetmedic/connectors/prometheus/_gpu_record.c)
    Extension("fleetmedic.connectors.prometheus._gpu_record", ["fleetmedic/connectors/prometheus/_gpu_record.c"],
              optional=True),
    # the what-if replay's scheduler shuffle (fleetmedic/sim/whatif/_shuffle.c)
    Extension("fleetmedic.sim.whatif._shuffle", ["fleetmedic/sim/whatif/_shuffle.c"], optional=True),
])
