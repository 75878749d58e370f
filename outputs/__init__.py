"""The dataset folder: Parquet shards, rejects, stats.json and the dataset card."""
