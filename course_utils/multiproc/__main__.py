"""``python -m course_utils.multiproc``: ранг под launch/torchrun или сам запускатель."""

import sys

from course_utils.multiproc.launcher import main

sys.exit(main())
