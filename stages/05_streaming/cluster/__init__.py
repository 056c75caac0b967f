"""The platform: engine replicas on Ray Serve behind one OpenAI gateway. ``deploy.py`` starts the cluster,
``replica.py`` holds one engine, ``gateway.py`` routes requests, ``calibrate.py`` picks a replica's batch size
from a latency target, and ``metrics.py`` aggregates the replicas' metrics."""
