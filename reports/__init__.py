"""The main job: run the properties and benchmarks, collect result rows, write the report."""
