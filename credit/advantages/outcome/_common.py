"""Former home of the pieces several outcome estimators share; they now live in
`credit.ops.baselines`, next to GAE, because other families build on them too. Import them
from there; these names stay only so that older code keeps working."""
from credit.ops.baselines import apply_singleton, grpo_scalar, is_one, token_rewards  # noqa: F401
