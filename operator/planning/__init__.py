"""Pure planning: spec -> resolved roles, KV layout, compat key, and every problem.

Entry point: :func:`sglang_pd_operator.planning.plan.build_plan`.
"""
