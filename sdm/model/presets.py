"""Named DLRM architectures (``sdm.model.PRESETS``), each with its source.

Widths follow the reference DLRM's command-line convention (facebookresearch/dlrm
``dlrm_s_pytorch.py``): the bottom MLP lists every width *including* its input (the dense
feature count), while ``top`` lists the layers *after* the interaction; the top MLP's input
width is derived from the interaction, as the reference does when it prepends ``num_int``:

* ``dot``: ``bottom_out + F(F-1)/2`` (``F(F+1)/2`` with self-interaction), F = tables + 1;
* ``cat``: ``bottom_out + tables * dim``.
"""

from __future__ import annotations

from dataclasses import dataclass

from sdm.errors import ConfigError
from sdm.validate import check_choice

__all__ = ["ModelPreset", "PRESETS", "INTERACTIONS", "interaction_width", "get_preset"]

INTERACTIONS = ("dot", "cat")


def interaction_width(interaction: str, bottom_out: int, dim: int, num_tables: int,
                      self_interaction: bool = False) -> int:
    """Width of the top MLP's input for ``interaction`` over ``num_tables`` pooled features."""
    if interaction == "dot":
        f = num_tables + 1
        pairs = f * (f + 1) // 2 if self_interaction else f * (f - 1) // 2
        return bottom_out + pairs
    if interaction == "cat":
        return bottom_out + num_tables * dim
    raise ConfigError(f"interaction {interaction!r} is not one of {INTERACTIONS}")


@dataclass(frozen=True)
class ModelPreset:
    """A DLRM architecture.

    ``bottom``: widths of the dense arch including its input, e.g. ``(13, 512, 256, 64)``.
    ``top``: widths of the over arch after its (derived) input, ending in 1.
    ``table_sizes``: rows per embedding table, all of width ``dim``.
    ``pooling``: typical lookups per bag (for benchmarks and traces, not the model).
    """

    name: str
    dim: int
    bottom: tuple[int, ...]
    top: tuple[int, ...]
    table_sizes: tuple[int, ...]
    pooling: int
    interaction: str = "dot"
    self_interaction: bool = False
    source: str = ""

    @property
    def num_dense(self) -> int:
        """Dense features per sample (the bottom MLP's input width)."""
        return self.bottom[0]

    @property
    def top_input(self) -> int:
        """Width of the top MLP's input, derived from the interaction."""
        return interaction_width(self.interaction, self.bottom[-1], self.dim,
                                 len(self.table_sizes), self.self_interaction)

    @property
    def top_widths(self) -> tuple[int, ...]:
        """Every width of the over arch, input first: ``(top_input,) + top``."""
        return (self.top_input,) + tuple(self.top)

    @property
    def table_bytes_fp32(self) -> int:
        """Bytes of every table as fp32 rows."""
        return 4 * self.dim * sum(self.table_sizes)


_KAGGLE = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
           27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572)
_TERABYTE = (9980333, 36084, 17217, 7378, 20134, 3, 7112, 1442, 61, 9758201, 1333352, 313829,
             10, 2208, 11156, 122, 4, 970, 14, 9994222, 7267859, 9946608, 415421, 12420, 101, 36)
_MLPERF = (39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346,
           10, 2208, 11938, 155, 4, 976, 14, 39979771, 25641295, 39664984, 585935, 12972, 108, 36)

PRESETS: dict[str, ModelPreset] = {p.name: p for p in (
    ModelPreset("criteo-kaggle", 16, (13, 512, 256, 64, 16), (512, 256, 1), _KAGGLE, 1,
                source="facebookresearch/dlrm bench/dlrm_s_criteo_kaggle.sh "
                       "(--arch-sparse-feature-size=16 --arch-mlp-bot=13-512-256-64-16 "
                       "--arch-mlp-top=512-256-1); table sizes of the Kaggle day split"),
    ModelPreset("criteo-terabyte", 64, (13, 512, 256, 64), (512, 512, 256, 1), _TERABYTE, 1,
                source="facebookresearch/dlrm bench/dlrm_s_criteo_terabyte.sh "
                       "(--max-ind-range=10000000)"),
    ModelPreset("mlperf-dlrm", 128, (13, 512, 256, 128), (1024, 1024, 512, 256, 1), _MLPERF, 1,
                source="MLPerf Inference/Training v1 DLRM (Criteo Terabyte, ids capped at 40M)"),
    ModelPreset("dlrm-bench", 64, (512, 512, 64), (1024, 1024, 1024, 1), (1_000_000,) * 8, 100,
                source="facebookresearch/dlrm bench/dlrm_s_benchmark.sh"),
    ModelPreset("rm1", 32, (128, 64, 32), (256, 64, 1), (4_000_000,) * 8, 80, "cat",
                source="harvard-acc/DeepRecSys models/configs/dlrm_rm1.json (Gupta et al. HPCA 2020)"),
    ModelPreset("rm2", 64, (256, 128, 64), (128, 64, 1), (500_000,) * 32, 120, "cat",
                source="harvard-acc/DeepRecSys models/configs/dlrm_rm2.json"),
    ModelPreset("rm3", 32, (2560, 1024, 256, 32), (512, 256, 1), (2_000_000,) * 10, 20, "cat",
                source="harvard-acc/DeepRecSys models/configs/dlrm_rm3.json"),
)}


def get_preset(name) -> ModelPreset:
    """The preset called ``name``; a :class:`ModelPreset` is returned as is."""
    if isinstance(name, ModelPreset):
        return name
    return PRESETS[check_choice(name, "model preset", sorted(PRESETS), error=ConfigError)]
