package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/edgepipe/edgepipe/internal/rtld/deadletter"
	"github.com/edgepipe/edgepipe/internal/rtld/delivery"
	"github.com/edgepipe/edgepipe/internal/rtld/receiver"
	"github.com/edgepipe/edgepipe/internal/sinks/clickhouse/logtable"
	kafkasink "github.com/edgepipe/edgepipe/internal/sinks/kafka"
)

// sinkSecrets are the secrets the sinks need (from the environment).
type sinkSecrets struct {
	clickhousePassword, kafkaUsername, kafkaPassword string
}

// openDeadLetters opens the dead-letter store of --spool.dir.
func openDeadLetters(f *flags, log *slog.Logger) (*deadletter.Store, error) {
	return deadletter.Open(deadletter.Options{
		Dir: filepath.Join(f.spoolDir, deadletter.DirName), MaxBytes: int64(f.deadLetterMaxBytes), Logger: log,
	})
}

// listDeadLetters prints the dead letters, one line per record, and a
// summary per sink.
func listDeadLetters(f *flags, out io.Writer) error {
	store, err := openDeadLetters(f, slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	files, err := store.Files(f.deadLetterSink)
	if err != nil {
		return err
	}
	if f.deadLetterJSON {
		enc := json.NewEncoder(out)
		for _, file := range files {
			letters, err := deadletter.ReadLetters(file.Path)
			if err != nil {
				return err
			}
			for _, l := range letters {
				if err := enc.Encode(l); err != nil {
					return err
				}
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SINK\tTIME\tREASON\tENVIRONMENT\tBATCH\tINDEX\tBYTES\tREPLAYS\tERROR")
	type total struct {
		files, records int
		bytes          int64
	}
	totals := map[string]*total{}
	var sinks []string
	for _, file := range files {
		letters, err := deadletter.ReadLetters(file.Path)
		if err != nil {
			return err
		}
		t := totals[file.Sink]
		if t == nil {
			t = &total{}
			totals[file.Sink] = t
			sinks = append(sinks, file.Sink)
		}
		t.files++
		t.records += len(letters)
		t.bytes += file.Bytes
		for _, l := range letters {
			batch := "hash " + l.BatchHash
			if l.AgentID != "" {
				batch = fmt.Sprintf("profile %s agent %s %s seq %d", l.ProfileID, l.AgentID, l.Datestamp, l.SeqNum)
			}
			msg := l.Error
			if len(msg) > 120 {
				msg = msg[:120] + "…"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\n", l.Sink, l.Time.Format(time.RFC3339), l.Reason, l.EnvironmentID,
				batch, l.RecordIndex, l.RecordBytes(), l.Replays, strings.ReplaceAll(msg, "\n", " "))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(sinks) == 0 {
		fmt.Fprintf(out, "no dead letters in %s\n", store.Dir())
	}
	for _, s := range sinks {
		t := totals[s]
		fmt.Fprintf(out, "%s: %d record(s), %d bytes in %d file(s)\n", s, t.records, t.bytes, t.files)
	}
	return nil
}

// replayDeadLetters delivers the dead letters again through sinks built
// from the same flags as the receiver's, and removes what they acknowledge.
func replayDeadLetters(ctx context.Context, f *flags, sec sinkSecrets, log *slog.Logger, out io.Writer) error {
	store, err := openDeadLetters(f, log)
	if err != nil {
		return err
	}
	files, err := store.Files(f.deadLetterSink)
	if err != nil {
		return err
	}
	var sinks []string
	for _, file := range files {
		if !slices.Contains(sinks, file.Sink) {
			sinks = append(sinks, file.Sink)
		}
	}
	if len(sinks) == 0 {
		fmt.Fprintf(out, "no dead letters to replay in %s\n", store.Dir())
		return nil
	}
	// Every sink with dead letters must be configured before any replays.
	built := map[string]delivery.Sink{}
	for _, name := range sinks {
		sink, closeSink, err := buildSink(name, f, sec, log)
		if err != nil {
			return err
		}
		defer closeSink()
		built[name] = sink
	}
	ctx, cancel := context.WithTimeout(ctx, f.replayTimeout)
	defer cancel()
	var again int
	for _, name := range sinks {
		d := &delivery.Deliverer{
			Sink: built[name], MinBackoff: 200 * time.Millisecond, MaxBackoff: 10 * time.Second,
			OnError: func(err error, batches, attempt int, wait time.Duration) {
				log.Warn("dead-letter replay: delivery failed, retrying", "sink", name, "records", batches, "attempt", attempt, "retry_in", wait, "err", err)
			},
		}
		rep, err := store.Replay(ctx, name, d)
		fmt.Fprintf(out, "%s: replayed %d file(s): %d record(s) delivered and removed, %d rejected again and kept\n", name, rep.Files, rep.Delivered, rep.Rejected)
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("%s: the sink did not take the dead letters within --timeout=%s; what was not delivered stays in the store: %w", name, f.replayTimeout, err)
			}
			return fmt.Errorf("%s: %w", name, err)
		}
		again += rep.Rejected
	}
	if again > 0 {
		return fmt.Errorf("%s record(s) were rejected again and stay in the store (see `rtld-receiver dead-letter list`)", strconv.Itoa(again))
	}
	return nil
}

// buildSink builds the named sink from the flags, as the receiver does.
func buildSink(name string, f *flags, sec sinkSecrets, log *slog.Logger) (delivery.Sink, func(), error) {
	switch name {
	case receiver.SinkKafka:
		cfg, err := kafkaConfig(f, sec.kafkaUsername, sec.kafkaPassword, log)
		if err != nil {
			return nil, nil, err
		}
		if cfg == nil {
			return nil, nil, errors.New("there are Kafka dead letters: give --kafka.brokers and the Kafka flags the receiver runs with (or --sink clickhouse)")
		}
		k, err := kafkasink.New(*cfg)
		if err != nil {
			return nil, nil, err
		}
		return k, func() { _ = k.Close() }, nil
	case receiver.SinkClickHouse:
		cfg, err := clickhouseConfig(f, sec.clickhousePassword)
		if err != nil {
			return nil, nil, err
		}
		if cfg == nil {
			return nil, nil, errors.New("there are ClickHouse dead letters: give --clickhouse.dsn as the receiver runs with (or --sink kafka)")
		}
		cfg.Logger = log
		c := logtable.New(*cfg)
		return c, func() { _ = c.Close() }, nil
	}
	return nil, nil, fmt.Errorf("dead letters of an unknown sink %q", name)
}
