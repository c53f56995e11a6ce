"""Trajectory records, atomic ArrayRecord shards, the Grain data source and the HTML shard viewer."""
