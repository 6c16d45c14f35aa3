"""strata on Ray Serve: engine replicas behind one front door, routed by what each holds."""
