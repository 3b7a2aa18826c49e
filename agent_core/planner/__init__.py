"""The fusion / stitch planner: regions of nodes that become one kernel, with the reasons why."""
from .execute import region_groups, region_order, run_by_region  # noqa: F401
from .fusion import Budgets, can_fuse, schedule_for  # noqa: F401
from .geometry import Geometry, geometry  # noqa: F401
from .plan import Plan, apply_plan, plan_program  # noqa: F401
