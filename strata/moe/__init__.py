"""The expert cache: experts' slots on the compute device (cache.py, slots.py, evict.py,
cost.py) and the device budget they share with the K/V ring (budget.py; its rule is
kv/budget_rule.py). The experts themselves and the bank protocol are the model's
(models/experts.py, models/expert_bank.py)."""
