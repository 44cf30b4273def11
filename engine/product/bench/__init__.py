"""The benchmark: prompt sets, the runner, aggregation into rows, the Markdown report, the llama.cpp peer."""
