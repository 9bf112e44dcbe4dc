// A test binary with no tests, for GtestMainFailsWhenNoTestIsLinked.
