"""A parameter sweep: the parameters one may sweep and the values read from text (``spec``), what a sweep holds
(``records``), the runs, each against AR timed before and after them (``runner``), each parted run attributed as a
tie or a bug (``attribution``), and the sweep's sentence and table (``report``).  The command line and its files are
cli/sweep.py; the figure is viz/sweep_figure.py.
"""
