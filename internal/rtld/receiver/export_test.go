package receiver

import "github.com/edgepipe/edgepipe/internal/rtld/spool"

// Spool returns the receiver's spool, for the tests and the benchmark that
// check its size and its readers' lag.
func (r *Receiver) Spool() *spool.Spool { return r.spool }
