//go:build !race

package resume

const raceEnabled = false
