"""Scale-out: mesh, logical-axis rules, shard helpers and multi-host initialisation."""
