package sim

import "testing"

// checks holds the Show assertions per suite. Each compares measured figures.
var checks = map[string]func(t *testing.T, os []outcome){}
