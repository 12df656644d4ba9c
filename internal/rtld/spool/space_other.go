//go:build !unix

package spool

import "errors"

// freeBytes is unknown here: a full spool retries writing after each
// probe interval instead.
func freeBytes(string) (int64, error) { return 0, errors.ErrUnsupported }

// isNoSpace knows no full-disk error here.
func isNoSpace(error) bool { return false }
