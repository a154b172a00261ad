# nbgrader configuration for the course. `tfs-grade` copies this file into each course
# directory it makes and appends the root and gradebook URL for that run.
c = get_config()  # noqa: F821

c.CourseDirectory.course_id = "transformers-from-scratch"
# A cell that runs longer than this is interrupted and reported; the rest of the notebook
# still runs (nbgrader's Execute interrupts on timeout).
c.Execute.timeout = 120
c.Execute.startup_timeout = 120
# What the student sees in place of a solution block.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"
