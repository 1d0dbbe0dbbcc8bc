"""The one exception type of the bitroll client."""


class BitrollError(Exception):
    """A typed error from the service or the client. `code` is the snake-case name of
    bitroll::ErrorCode (schema/status.h), or "timeout" / "protocol" for client-side errors."""

    def __init__(self, code, message, group_id=0):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.group_id = group_id
