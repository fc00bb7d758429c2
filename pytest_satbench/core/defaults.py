"""The defaults of the analysis that every layer shares, written once.

Engine settings have theirs in `engine/config.py` (`RuntimeConfig`); what the statistics use
(the intervals' bootstrap resamples) is read by the option table, the report CLI and the route
from the store to the numbers alike, so it lives here, a leaf module that imports nothing.
"""

BOOTSTRAP = 1000  # bootstrap resamples of every interval (--bootstrap, the report CLI's --iterations)
