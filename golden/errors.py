# The golden producer's one error type: an exit status with mih's meanings (README, "Exit
# codes": 2 usage, 11 bad input, 12 environment, 13 unimplemented) and a message naming the
# problem and the fix.


class GoldenError(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message
