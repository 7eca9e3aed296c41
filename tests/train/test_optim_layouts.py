"""Which optimizer layouts the local backend resumes, and the refusals for the ones it cannot."""

from __future__ import annotations

import pytest

from longctx.errors import TrainError
from longctx.train import optim


@pytest.mark.parametrize(
    "common, layout",
    [
        ({"optimizer": {"param_state_sharding_type": "fully_reshardable"}}, optim.FULLY_RESHARDABLE),
        (
            {
                "optimizer": {"optimizer": {"param_groups": []}},
                "content_metadata": {"distrib_optim_sharding_type": "fully_reshardable"},
            },
            optim.FULLY_RESHARDABLE,
        ),
        ({"optimizer": {"state": {"common_step": 4}, "param_groups": []}}, optim.PLAIN),
        ({"optimizer": {"param_groups": [], "common_step": 4.0}}, optim.PLAIN),  # longctx's earlier saves
        ({"optimizer": {"optimizer": {"state": {}, "param_groups": []}}}, optim.FLOAT16),
    ],
)
def test_readable_layouts(common: dict, layout: str) -> None:
    assert optim.layout_of(common, "ck") == layout


@pytest.mark.parametrize(
    "common, says",
    [
        ({"optimizer": {"param_state_sharding_type": "dp_reshardable"}}, "'dp_reshardable' layout"),
        (
            {"content_metadata": {"distrib_optim_sharding_type": "dp_zero_gather_scatter"}, "optimizer": {}},
            "'dp_zero_gather_scatter' layout",
        ),
        ({"args": None}, "no optimizer state"),
        ({"optimizer": {"weird": 1}}, "structure the local backend does not know"),
    ],
)
def test_unreadable_layouts_are_refused_with_a_fix(common: dict, says: str) -> None:
    with pytest.raises(TrainError) as err:
        optim.layout_of(common, "ckpt/iter_0000004")
    assert says in str(err.value) and err.value.where == "ckpt/iter_0000004" and err.value.fix
