package relay

import "time"

// SetPrimeDelay sets how long a call's stream holds its priming event back
// (primeDelay) until the test ends.
func SetPrimeDelay(d time.Duration) (restore func()) {
	old := primeDelay
	primeDelay = d
	return func() { primeDelay = old }
}
