package clickhouse

import (
	"context"
	"testing"
	"time"
)

// TestWriterStop checks the three ends of a writer: never started (Stop
// returns at once), finishing its work once woken by Stop, and stuck past
// Stop's deadline (Context ends, Stop waits for it to return).
func TestWriterStop(t *testing.T) {
	for _, tc := range []struct {
		name      string
		start     bool
		stuck     bool // the writer returns only when its Context ends
		wantEnded bool // Context ended before the writer returned
	}{
		{name: "never started"},
		{name: "finishes", start: true},
		{name: "stuck past the deadline", start: true, stuck: true, wantEnded: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := NewWriter()
			returned := make(chan bool, 1) // whether Context had ended
			if tc.start {
				w.Start(func() {
					<-w.Woken() // Stop wakes it
					if tc.stuck {
						<-w.Context().Done()
					}
					returned <- w.Context().Err() != nil
				})
				w.Start(func() { t.Error("a second Start ran its function") })
			}
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			w.Stop(ctx)
			if !tc.start {
				if w.Context().Err() != nil {
					t.Error("Stop of a writer never started ended its Context")
				}
				return
			}
			select {
			case ended := <-returned:
				if ended != tc.wantEnded {
					t.Errorf("Context ended before the writer returned: %v, want %v", ended, tc.wantEnded)
				}
			default:
				t.Fatal("Stop returned before the writer did")
			}
			if w.Context().Err() == nil {
				t.Error("Context still running after Stop")
			}
		})
	}
}
