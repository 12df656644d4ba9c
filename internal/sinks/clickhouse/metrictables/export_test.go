package metrictables

import (
	"context"
	"fmt"
	"time"
)

// Flush waits until every row queued so far is written or ctx ends.
func (s *Sink) Flush(ctx context.Context) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if s.QueuedRows() == 0 && s.idle() {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("flush ClickHouse sink (%d rows queued): %w", s.QueuedRows(), ctx.Err())
		case <-t.C:
		}
	}
}

func (s *Sink) idle() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inFlight == 0
}
