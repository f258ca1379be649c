package testenv

import (
	"os"
	"time"
)

// SoakEnv, set to 1, runs the soak-style tests at their long lengths (make
// test-soak, a nightly target); the README's test command runs them short,
// long enough for each assertion to bite (each test says why its short
// length is), so that the suite stays within CI's budget.
const SoakEnv = "TIERLIMIT_SOAK"

// Soak returns long under TIERLIMIT_SOAK=1 and short otherwise.
func Soak(short, long time.Duration) time.Duration {
	if os.Getenv(SoakEnv) == "1" {
		return long
	}
	return short
}
