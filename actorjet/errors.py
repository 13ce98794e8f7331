"""The one exception type a user mistake raises.

The CLI prints a ``UserError`` as a single line and exits non-zero; anything else is a
bug and keeps its traceback.
"""


class UserError(Exception):
    """A mistake in the user's input (config, arguments, environment), not a bug."""
