"""Prompt-group filtering by accuracy: PRIME's online prompt filter, DAPO's dynamic sampling.

PRIME (arXiv 2502.01456; its run scripts) keeps only the prompts whose group accuracy lies in
[0.2, 0.8], so the implicit PRM and the policy learn from groups with both outcomes. DAPO
(arXiv 2503.14476, §3.2) drops groups whose rewards are all equal, since GRPO gives them no
gradient. Here a stage placed right after the reward drops those groups from the step: their
rows' `response_mask` becomes empty (in the batch and in its host copies). Every later producer
(the implicit PRM's update included), the estimator and the loss then see only the kept
groups. Shapes do not change, so nothing recompiles.

    acc_g = mean_{b ∈ g} [R_b ≥ τ]
    keep_g = min_accuracy ≤ acc_g ≤ max_accuracy  and  (not drop_uniform or R varies in g)

What differs from the papers' loops: they sample again until the batch is full of kept
groups (DAPO's `max_num_gen_batches`, PRIME's oversampling), so every step has a full batch;
here the step trains on the groups it kept, and a step that keeps none is skipped (no
update; `update_skipped` = 1). Metrics: `group_kept_frac`, the fraction of the step's groups
kept. The filter acts before the producers that come after the reward. Those that ran before
it (the rollout, the sampler's log-probs) still produced values for the dropped rows. Those
values are then unused.

Config (`c.group_filter`): min_accuracy / max_accuracy (0 / 1: off), drop_uniform (False),
success_threshold τ (1.0). PRIME: 0.2 / 0.8; DAPO: drop_uniform=True.

As an extension (`EXTENSION`): a stage right after the stage that makes `reward`, and a step
whose filter kept no group is skipped.
"""
from __future__ import annotations

from typing import Any, Mapping

import ml_collections
import numpy as np

from credit import parallel
from experiments import producers
from experiments.extensions import jolt, subagents
from experiments.extensions.base import Built, Extension, Placed

NAME = "group_filter"


def on(c: ml_collections.ConfigDict) -> bool:
  g = c.group_filter
  return bool(g.min_accuracy > 0.0 or g.max_accuracy < 1.0 or g.drop_uniform)


def check(c: ml_collections.ConfigDict) -> None:
  g = c.group_filter
  if not 0.0 <= g.min_accuracy <= g.max_accuracy <= 1.0:
    raise producers.SetupError(
        f"group_filter: need 0 <= min_accuracy <= max_accuracy <= 1, got "
        f"{g.min_accuracy}, {g.max_accuracy}")
  if on(c) and (jolt.on(c) or subagents.on(c)):
    raise producers.SetupError("group_filter does not filter JOLT's teacher-role rows or the "
                               "document agents' rows; turn one of them off")


def kept_rows(reward: np.ndarray, group_id: np.ndarray, valid: np.ndarray, *,
              min_accuracy: float, max_accuracy: float, drop_uniform: bool,
              success_threshold: float) -> np.ndarray:
  """[B] bool: the rows whose group passes the filter (groups from the valid rows; a group
  without a valid row is dropped)."""
  reward, gid = np.asarray(reward, np.float64), np.asarray(group_id)
  keep = np.zeros(reward.shape, bool)
  for g in np.unique(gid[valid]):
    rows = (gid == g) & valid
    r = reward[rows]
    acc = float(np.mean(r >= success_threshold))
    ok = min_accuracy <= acc <= max_accuracy and not (drop_uniform and np.all(r == r[0]))
    keep |= rows & ok
  return keep


def build_stage(s: producers.Setup) -> producers.Stage:
  """The filter's stage: `response_mask` of the dropped groups emptied (see the module)."""
  g = s.c.group_filter
  kw = dict(min_accuracy=float(g.min_accuracy), max_accuracy=float(g.max_accuracy),
            drop_uniform=bool(g.drop_uniform), success_threshold=float(g.success_threshold))

  def produce(state, batch, ctx: producers.StepContext) -> dict:
    host = batch["host"]
    resp, gid = host["response_mask"], host["group_id"]
    valid = resp.any(-1)
    keep = kept_rows(parallel.to_host(batch["reward"]), gid, valid, **kw)
    mask = resp & keep[:, None]
    groups = np.unique(gid[valid])
    ctx.metrics["group_kept_frac"] = (float(len(np.unique(gid[keep]))) / len(groups)
                                      if len(groups) else 0.0)
    host = dict(host, response_mask=mask,
                sampled_response_mask=host.get("sampled_response_mask", resp))
    return {"response_mask": parallel.shard_batch(mask, s.mesh), "host": host}

  return producers.Stage(NAME, "reward", frozenset({"response_mask"}), produce)


def nothing_kept(batch: Mapping[str, Any], ctx: producers.StepContext) -> bool:
  """The filter kept no group this step (no response token left): the step makes no update,
  as PRIME and DAPO skip such batches."""
  del ctx
  return not batch["host"]["response_mask"].any()


def build(s: producers.Setup, method: Any) -> Built:
  del method
  return Built(stages=(Placed(build_stage(s), after="reward"),), skip=nothing_kept)


EXTENSION = Extension(
    name=NAME, on=on, check=check, build=build,
    doc="PRIME's / DAPO's prompt-group filter: groups outside the accuracy band (or with "
        "uniform rewards) dropped right after the reward; a step that keeps none is skipped")
