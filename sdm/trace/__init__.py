"""Access traces: the sdm trace file, generators, importers and locality statistics.

Modules, one concern each: :mod:`~sdm.trace.format` (the versioned ``.npz`` file, ``load``,
``save``, ``Batch``, ``Trace``), :mod:`~sdm.trace.generate` (seeded generators and named
profiles), :mod:`~sdm.trace.stackdist` (LRU stack distances and the reference DLRM distribution
file), :mod:`~sdm.trace.importers` (FBGEMM / dlrm_datasets, DLRM logs, Criteo TSV),
:mod:`~sdm.trace.stats` (locality statistics) and :mod:`~sdm.trace.render` (text and PNG).
"""

from sdm.trace.format import (SCHEMA_VERSION, Batch, Trace, TraceFormatError, TraceNotFoundError,
                              TraceWriter, load, save)
from sdm.trace.stackdist import (StackDistanceDistribution, fit_stack_distance,
                                 generate_stack_distance_keys, read_dist_file, stack_distances,
                                 write_dist_file)
from sdm.trace.generate import PROFILES, GeneratedTrace, Profile, generate, generate_to, get_profile
from sdm.trace.stats import TraceStats, read_locality_stats, table_stack_distribution, trace_stats
from sdm.trace.importers import (IMPORTERS, import_criteo, import_dlrm_dist, import_dlrm_trace,
                                 import_fbgemm, read_fbgemm)
from sdm.trace import render

__all__ = [
    "SCHEMA_VERSION", "Batch", "Trace", "TraceWriter", "TraceFormatError", "TraceNotFoundError",
    "load", "save",
    "PROFILES", "Profile", "GeneratedTrace", "generate", "generate_to", "get_profile",
    "StackDistanceDistribution", "stack_distances", "fit_stack_distance", "read_dist_file",
    "write_dist_file", "generate_stack_distance_keys",
    "TraceStats", "trace_stats", "table_stack_distribution", "read_locality_stats",
    "IMPORTERS", "import_fbgemm", "read_fbgemm", "import_dlrm_trace", "import_dlrm_dist",
    "import_criteo", "render",
]
