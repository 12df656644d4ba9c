//go:build !unix

package deadletter

// lockReplay does not lock where flock is missing: run one replay at a time.
func lockReplay(string) (func(), error) { return func() {}, nil }
