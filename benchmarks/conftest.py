"""The benchmark suite. Its results store, demo data and reconstruction cache live in pytest's
cache folder of the rootdir, `.pytest_cache/d/` at the repository root (`satbench/results.sqlite`,
`satbench-data/`, `satbench-recon/`), or wherever `--store` puts the store."""
