"""Mixture-of-experts: one expert's weights (experts.py), where a layer's experts run
(bank.py: all resident, or the expert cache)."""
