"""reset_position_ids inside the trainer's GPTModel (megatron-core, longctx attention, RoPE from the
position ids): what restarting positions at each document changes, and what it cannot change.

The same packed batch of three documents runs with plain positions 0 … S−1 and with positions reset at
each document, as `micro_batch` builds them. What is true, and why:

* The model's RoPE takes the batch's position ids: the angles it applies are those of the reset
  positions (megatron-core alone would ignore them and always use 0 … S−1).
* The first document's logits are bit-identical: its tokens have the same positions either way, and
  none of its queries sees a later token.
* With attention restricted to documents, every later token's logits and the loss are equal up to
  float rounding, not bit-identical. RoPE rotates q and k by angles proportional to their positions,
  so a score q·k depends only on the distance between query and key; within one document, shifting
  every position by the document's start leaves every distance, hence every score, unchanged in exact
  arithmetic. Only the rounding of the larger angles (cos/sin of p·θ for p up to S) differs.
* Without that restriction (dense causal attention over the whole window), a later document's tokens
  see earlier documents' keys, and resetting positions changes those distances (a key of the first
  document can then sit at a *larger* position than the query): its logits change by far more than
  rounding. That is why reset_position_ids goes with attention within documents.
"""

from __future__ import annotations

import torch

from longctx.arch import ModelArch
from longctx.attention.megatron_adapter import document_params, eod_document_bounds
from longctx.mcore.model import ModelSettings, build_gpt_model
from longctx.mcore.parallel import eval_parallel
from longctx.mcore.positions import rope_from_position_ids, rotary_angles
from longctx.train.data import document_positions
from tests.fixtures.run import ARCH

S, VOCAB, EOD = 64, 128, 2
LENGTHS = (20, 25, 19)  # three documents, each ending with EOD


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(3, VOCAB, (1, S), generator=gen)
    ends = torch.tensor(LENGTHS).cumsum(0) - 1
    tokens[0, ends] = EOD
    return tokens, tokens.roll(-1, dims=1)


def test_reset_position_ids_changes_rope_but_not_attention_within_documents() -> None:
    tokens, labels = _batch()
    cu = eod_document_bounds(tokens, EOD)
    assert cu.tolist() == [0, 20, 45, 64]
    plain = torch.arange(S)[None]
    reset = document_positions(cu, 1, S)
    assert reset[0, :20].equal(plain[0, :20]) and reset[0, 20].item() == 0 and reset[0, 45].item() == 0
    first = slice(0, LENGTHS[0])
    later = slice(LENGTHS[0], S)
    with eval_parallel(1), torch.no_grad():
        torch.manual_seed(0)
        settings = ModelSettings(seq_length=S, rotary_base=10000, padded_vocab_size=VOCAB)
        model = rope_from_position_ids(build_gpt_model(ModelArch(**ARCH), settings)).eval()
        angles: list[torch.Tensor] = []
        model.rotary_pos_emb.register_forward_hook(lambda _m, _a, out: angles.append(out))
        within = document_params(cu, S, split="balanced")  # as the trainer passes packed batches

        def run(positions: torch.Tensor, packed: object) -> tuple[torch.Tensor, torch.Tensor]:
            logits = model(tokens, positions, None, packed_seq_params=packed)
            loss = model(tokens, positions, None, labels=labels, packed_seq_params=packed)
            return logits.float(), loss.float().mean()

        logits_plain, loss_plain = run(plain, within)
        logits_reset, loss_reset = run(reset, within)
        # the angles RoPE applied are those of the position ids given, per forward
        assert angles[0].equal(rotary_angles(model.rotary_pos_emb, plain))
        assert angles[2].equal(rotary_angles(model.rotary_pos_emb, reset))
        assert not angles[0].equal(angles[2])

        assert logits_plain[:, first].equal(logits_reset[:, first])
        assert not logits_plain[:, later].equal(logits_reset[:, later])  # other angles, other rounding
        torch.testing.assert_close(logits_reset[:, later], logits_plain[:, later], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(loss_reset, loss_plain, rtol=1e-5, atol=1e-6)

        dense_plain, _ = run(plain, None)
        dense_reset, _ = run(reset, None)
    assert dense_plain[:, first].equal(dense_reset[:, first])
    assert (dense_plain[:, later] - dense_reset[:, later]).abs().max() > 1e-2
    # and within documents is not dense: the later documents do see the first one there
    assert (dense_plain[:, later] - logits_plain[:, later]).abs().max() > 1e-2
