"""sdm.model against an independent torch DLRM (nn.Linear, nn.EmbeddingBag(mode="sum"),
bmm interaction) carrying the same weights: dot, dot with self-interaction, and cat, with
empty bags and repeated rows."""

from __future__ import annotations

import os

import numpy as np
import pytest

from sdm.model import DLRM, ModelPreset, load_npz

import peers  # noqa: E402

torch = peers.require("torch")
pytestmark = pytest.mark.peers
nn = torch.nn


class TorchDLRM(nn.Module):
    """The reference DLRM's forward, written with stock torch modules."""

    def __init__(self, m: DLRM):
        super().__init__()
        self.interaction = m.interaction
        self.itself = m.self_interaction
        self.bottom = self._mlp(m.bottom, last=nn.ReLU())
        self.top = self._mlp(m.top, last=nn.Sigmoid())
        self.embs = nn.ModuleList()
        for t in m.sparse.tables:
            bag = nn.EmbeddingBag(t.shape[0], t.shape[1], mode="sum", include_last_offset=True)
            bag.weight.data = torch.from_numpy(t.copy())
            self.embs.append(bag)

    @staticmethod
    def _mlp(mlp, last):
        layers = []
        for i, (w, b) in enumerate(zip(mlp.weights, mlp.biases)):
            lin = nn.Linear(w.shape[1], w.shape[0])
            lin.weight.data = torch.from_numpy(w.copy())
            lin.bias.data = torch.from_numpy(b.copy())
            layers += [lin, last if i == len(mlp.weights) - 1 else nn.ReLU()]
        return nn.Sequential(*layers)

    def forward(self, dense, sparse):
        x = self.bottom(dense)
        ly = [emb(ids, offs) for emb, (ids, offs) in zip(self.embs, sparse)]
        if self.interaction == "cat":
            r = torch.cat([x] + ly, dim=1)
        else:
            b, d = x.shape
            t = torch.cat([x] + ly, dim=1).view(b, -1, d)
            z = torch.bmm(t, t.transpose(1, 2))
            f = t.shape[1]
            li, lj = torch.tril_indices(f, f, offset=0 if self.itself else -1)
            r = torch.cat([x, z[:, li, lj]], dim=1)
        return self.top(r).view(-1)


def batch(rng, m: DLRM, size: int):
    dense = rng.standard_normal((size, m.num_dense)).astype(np.float32)
    sparse = []
    for rows in m.sparse.table_sizes:
        lengths = rng.integers(0, 9, size)
        lengths[: size // 5] = 0  # empty bags
        ids = rng.integers(0, rows, int(lengths.sum()))
        if len(ids) > 2:
            ids[1] = ids[0]  # a repeated row inside a bag (or across two)
        sparse.append((ids, np.concatenate([[0], np.cumsum(lengths)])))
    return dense, sparse


@pytest.mark.parametrize("interaction,itself", [("dot", False), ("dot", True), ("cat", False)])
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_torch(interaction, itself, seed):
    dim = 16
    arch = ModelPreset("t", dim, (13, 64, 32, dim if interaction == "dot" else 24), (48, 16, 1),
                       (300, 1, 77, 1000, 5), 4, interaction, itself)
    m = DLRM.random(arch, seed=seed)
    peer = TorchDLRM(m).eval()
    rng = np.random.default_rng(seed)
    for size in (1, 50, 257):
        dense, sparse = batch(rng, m, size)
        with torch.no_grad():
            want = peer(torch.from_numpy(dense),
                        [(torch.from_numpy(i), torch.from_numpy(o)) for i, o in sparse]).numpy()
            pooled_want = [emb(torch.from_numpy(i), torch.from_numpy(o)).numpy()
                           for emb, (i, o) in zip(peer.embs, sparse)]
        for overlap in (True, False):
            got = m.forward(dense, sparse, overlap=overlap)
            assert got.shape == want.shape == (size,)
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
        np.testing.assert_allclose(m.pooled(sparse, batch=size), np.stack(pooled_want), rtol=0, atol=1e-5)


def test_reference_fixture_matches_torch():
    """The golden file, run through the torch peer built from sdm's loaded weights."""
    here = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "fixtures", "dlrm_reference",
                        "small_dot.npz")
    path = here if os.path.exists(here) else "/work/shared/fixtures/dlrm_reference/small_dot.npz"
    m = load_npz(path)
    with np.load(path, allow_pickle=False) as d:
        dense, out = d["dense_x"], d["output"]
        sparse = [(d[f"indices_{k}"], np.append(d[f"offsets_{k}"], len(d[f"indices_{k}"]))) for k in range(4)]
    with torch.no_grad():
        got = TorchDLRM(m).eval()(torch.from_numpy(dense),
                                  [(torch.from_numpy(i), torch.from_numpy(o)) for i, o in sparse]).numpy()
    np.testing.assert_allclose(got, out[:, 0], rtol=0, atol=1e-5)
    np.testing.assert_allclose(m.forward(dense, sparse), got, rtol=0, atol=1e-5)
