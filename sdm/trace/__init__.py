"""Access traces: the sdm trace file, generators, importers and locality statistics."""
from sdm.trace.format import (SCHEMA_VERSION, Batch, Trace, TraceFormatError, TraceNotFoundError,
                              TraceWriter, load, save)
from sdm.trace.stackdist import (StackDistanceDistribution, fit_stack_distance,
                                 generate_stack_distance_keys, read_dist_file, stack_distances,
                                 write_dist_file)
from sdm.trace.generate import PROFILES, GeneratedTrace, Profile, generate, generate_to, get_profile
from sdm.trace.stats import TraceStats, read_locality_stats, table_stack_distribution, trace_stats
from sdm.trace.importers import (IMPORTERS, import_criteo, import_dlrm_dist, import_dlrm_trace,
                                 import_fbgemm, read_fbgemm)
