// Package rtld is edgepipe's real-time log delivery receiver: the ingest
// source that accepts the platform's access-log batches, the gap detector and
// the profile registrar. The data types live in internal/accesslog, the spool in
// rtld/spool, the delivery workers in rtld/delivery; rtld/receiver wires them.
package rtld

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/klauspost/compress/flate"

	"github.com/go-chi/chi/v5"
	kgzip "github.com/klauspost/compress/gzip"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/rtld/spool"
)

// Defaults of IngestConfig.
const (
	DefaultMaxBodyBytes    = 16 << 20
	DefaultMaxDecodedBytes = 32 << 20
	DefaultMaxMemoryBytes  = 128 << 20
	DefaultMaxInFlight     = 16
	DefaultMaxRecordBytes  = 512 << 10
	DefaultRetryAfter      = 5 * time.Second
	DefaultBodyTimeout     = 30 * time.Second
	DefaultQueueWait       = 2 * time.Second
)

// IngestConfig configures the ingest source.
type IngestConfig struct {
	// Username and Password are the HTTP basic credentials every batch must
	// carry (the ones written into the profiles).
	Username, Password string
	// MaxBodyBytes bounds the request body as sent (gzip); 413 beyond.
	MaxBodyBytes int64
	// MaxDecodedBytes bounds the body after decompression; 413 beyond.
	MaxDecodedBytes int64
	// MaxMemoryBytes bounds the memory of request bodies in flight, as
	// received and decompressed. A request that does not fit waits up to
	// QueueWait, then gets 503 with Retry-After. It must hold at least one
	// request of MaxBodyBytes and MaxDecodedBytes (MinMemoryBytes).
	MaxMemoryBytes int64
	// MaxRecordBytes bounds one record's JSON; a batch holding a bigger one
	// is refused with 413 rather than accepted and then stuck forever in
	// front of a sink that cannot take it (Kafka's message.max.bytes).
	MaxRecordBytes int
	// MaxInFlight is how many received requests are decompressed, decoded
	// and spooled at once; a request waits up to QueueWait for a slot, then
	// gets 503 with Retry-After. A slot is taken only once the body has
	// arrived, so slow senders cannot hold the slots.
	MaxInFlight int
	// BodyTimeout is how long a request body may take to arrive; slower
	// senders get 408 (the platform retries).
	BodyTimeout time.Duration
	// QueueWait is how long a received request waits for a slot or for
	// memory before 503.
	QueueWait time.Duration
	// RetryAfter is the Retry-After sent with 503 answers.
	RetryAfter time.Duration
	// AllowEnvironment reports whether batches for an environment are
	// accepted (404 otherwise). Nil accepts every environment.
	AllowEnvironment func(environmentID string) bool
	// Observer, when set, is told about every batch made durable.
	Observer SpoolObserver
}

// WithDefaults returns c with every zero field set to its default. It is
// exported, like Validate, for the receiver, whose configuration holds an
// IngestConfig: NewIngest applies both itself.
func (c IngestConfig) WithDefaults() IngestConfig {
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.MaxDecodedBytes == 0 {
		c.MaxDecodedBytes = DefaultMaxDecodedBytes
	}
	if c.MaxMemoryBytes == 0 {
		c.MaxMemoryBytes = DefaultMaxMemoryBytes
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.MaxRecordBytes == 0 {
		c.MaxRecordBytes = DefaultMaxRecordBytes
	}
	if c.BodyTimeout == 0 {
		c.BodyTimeout = DefaultBodyTimeout
	}
	if c.QueueWait == 0 {
		c.QueueWait = DefaultQueueWait
	}
	if c.RetryAfter == 0 {
		c.RetryAfter = DefaultRetryAfter
	}
	return c
}

// Validate refuses a configuration (with defaults applied) that cannot
// work, naming every problem.
func (c IngestConfig) Validate() error {
	if err := errors.Join(
		positive("MaxBodyBytes", c.MaxBodyBytes), positive("MaxDecodedBytes", c.MaxDecodedBytes),
		positive("MaxMemoryBytes", c.MaxMemoryBytes), positive("MaxInFlight", c.MaxInFlight),
		positive("MaxRecordBytes", c.MaxRecordBytes), positive("BodyTimeout", c.BodyTimeout),
		positive("QueueWait", c.QueueWait), positive("RetryAfter", c.RetryAfter),
	); err != nil {
		return err
	}
	if need := MinMemoryBytes(c.MaxBodyBytes, c.MaxDecodedBytes); c.MaxMemoryBytes < need {
		return fmt.Errorf("ingest memory bound of %d bytes cannot hold one request of %d bytes as sent and %d decompressed: it must be at least %d bytes",
			c.MaxMemoryBytes, c.MaxBodyBytes, c.MaxDecodedBytes, need)
	}
	return nil
}

// positive refuses a setting that is not above zero (zero settings have
// their defaults by then, so it is negative).
func positive[T int | int64 | time.Duration](name string, v T) error {
	if v > 0 {
		return nil
	}
	return fmt.Errorf("%s %v: must be positive", name, v)
}

// MinMemoryBytes returns the smallest MaxMemoryBytes that holds one request
// of maxBody bytes as sent and maxDecoded bytes decompressed (in the
// buffer sizes ingest uses).
func MinMemoryBytes(maxBody, maxDecoded int64) int64 {
	chunk := int64(1) << minBufferClass
	return (maxBody+chunk-1)/chunk*chunk + classSize(classOf(maxDecoded+1))
}

// SpoolEntryBytes returns the largest spool entry a batch of at most
// maxDecoded bytes (decompressed) can make: records are copied with a
// length prefix instead of their separator, plus the batch's metadata.
func SpoolEntryBytes(maxDecoded int64) int64 {
	return maxDecoded + maxDecoded/64 + 64<<10
}

// Spooler is what ingest needs from the spool.
type Spooler interface {
	AppendPayload(ctx context.Context, p spool.Payload) error
	Full() bool
}

// DuplicateChecker is what ingest needs from the gap tracker: claiming a
// batch before spooling it (ErrDuplicate when it is already spooled, or was
// by a copy posted concurrently), and counting a dropped duplicate.
type DuplicateChecker interface {
	Claim(ctx context.Context, b *accesslog.Batch, wait time.Duration) (*BatchClaim, error)
	CountDuplicate(env, agent string)
}

// Ingest is the source of the receiver: the HTTP endpoint the platform
// posts batches to. A batch is acknowledged (2xx) only once it is durable in
// the spool.
type Ingest struct {
	cfg      IngestConfig
	spool    Spooler
	dups     DuplicateChecker
	metrics  *Metrics
	log      *slog.Logger
	sem      chan struct{}
	mem      *bodyMemory
	userHash [32]byte
	passHash [32]byte
	gzPool   sync.Pool
	load     IngestLoad
}

// NewIngest returns the ingest source writing to sp. dups may be nil. It
// refuses a configuration that cannot work.
func NewIngest(cfg IngestConfig, sp Spooler, dups DuplicateChecker, m *Metrics, log *slog.Logger) (*Ingest, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("rtld ingest: invalid configuration: %w", err)
	}
	if log == nil {
		log = slog.Default()
	}
	return &Ingest{
		cfg: cfg, spool: sp, dups: dups, metrics: m, log: log,
		sem:      make(chan struct{}, cfg.MaxInFlight),
		mem:      newBodyMemory(cfg.MaxMemoryBytes),
		userHash: sha256.Sum256([]byte(cfg.Username)),
		passHash: sha256.Sum256([]byte(cfg.Password)),
	}, nil
}

// Load returns how busy ingest is (see IngestLoad).
func (in *Ingest) Load() *IngestLoad { return &in.load }

// Route is the ingest path pattern; the profile's destination_endpoint is
// <public-url>/ingest/<environment_id>.
const Route = "/ingest/{environment_id}"

// EndpointPath returns the ingest path for an environment.
func EndpointPath(environmentID string) string { return "/ingest/" + environmentID }

// Register mounts the ingest route on r.
func (in *Ingest) Register(r chi.Router) {
	r.Post(Route, in.ServeHTTP)
}

// authorized compares the credentials in constant time: both are hashed to
// equal length and both comparisons always run.
func (in *Ingest) authorized(r *http.Request) bool {
	user, pass, ok := r.BasicAuth()
	u := sha256.Sum256([]byte(user))
	p := sha256.Sum256([]byte(pass))
	okUser := subtle.ConstantTimeCompare(u[:], in.userHash[:])
	okPass := subtle.ConstantTimeCompare(p[:], in.passHash[:])
	return ok && okUser&okPass == 1
}

// errDecodedTooLarge is returned by the decoded-size limit.
var errDecodedTooLarge = errors.New("decoded body exceeds the limit")

type errorBody struct {
	Error  string `json:"error"`
	Status int    `json:"status"`
	Line   int    `json:"line,omitempty"`
	Offset *int64 `json:"offset,omitempty"`
}

func (in *Ingest) reply(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

func (in *Ingest) fail(w http.ResponseWriter, status int, outcome string, wire int64, msg string) {
	in.metrics.batches.WithLabelValues(outcome).Inc()
	in.metrics.bytes.WithLabelValues(outcome).Add(float64(wire))
	if status == http.StatusServiceUnavailable || status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", strconv.Itoa(int((in.cfg.RetryAfter+time.Second-1)/time.Second)))
	}
	in.reply(w, status, errorBody{Error: msg, Status: status})
}

// errBodyTimeout is returned when a body does not arrive within
// BodyTimeout.
var errBodyTimeout = errors.New("request body not received in time")

// ServeHTTP handles one batch: it receives the body (holding no slot),
// then in a slot decompresses, decodes and spools it, within the memory
// budget.
func (in *Ingest) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	in.metrics.inFlight.Inc()
	defer in.metrics.inFlight.Dec()

	if !in.authorized(r) {
		w.Header().Set("WWW-Authenticate", `Basic realm="edgepipe", charset="UTF-8"`)
		in.fail(w, http.StatusUnauthorized, StatusUnauthorized, 0, "missing or wrong credentials")
		return
	}
	env := chi.URLParam(r, "environment_id")
	if env == "" || (in.cfg.AllowEnvironment != nil && !in.cfg.AllowEnvironment(env)) {
		in.fail(w, http.StatusNotFound, StatusNotFound, 0, fmt.Sprintf("environment %q is not served here", env))
		return
	}
	if in.spool.Full() {
		in.fail(w, http.StatusServiceUnavailable, StatusUnavailable, 0, "spool is full, retry later")
		return
	}
	if r.ContentLength > in.cfg.MaxBodyBytes {
		in.fail(w, http.StatusRequestEntityTooLarge, StatusTooLarge, 0,
			fmt.Sprintf("request body of %d bytes exceeds %d bytes", r.ContentLength, in.cfg.MaxBodyBytes))
		return
	}
	gzipped := false
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip", "x-gzip":
		gzipped = true
	default:
		in.fail(w, http.StatusUnsupportedMediaType, StatusMalformed, 0, fmt.Sprintf("unsupported Content-Encoding %q (gzip or identity)", enc))
		return
	}

	wire, err := in.receive(w, r)
	defer func() { in.release(wire.chunks...) }()
	if err != nil {
		in.bodyFailed(w, wire.n, err)
		return
	}
	if !in.takeSlot(r.Context()) {
		in.fail(w, http.StatusServiceUnavailable, StatusUnavailable, wire.n, "too many requests in flight, retry later")
		return
	}
	in.load.enter()
	defer func() {
		in.load.leave()
		<-in.sem
	}()

	decoded, err := in.decompress(r.Context(), wire, gzipped)
	in.release(wire.chunks...)
	wire.chunks = nil
	defer in.release(decoded)
	if err != nil {
		in.bodyFailed(w, wire.n, err)
		return
	}
	batch, err := accesslog.DecodeBytes(env, decoded)
	if err != nil {
		in.bodyFailed(w, wire.n, err)
		return
	}
	batch.ReceivedUnixNano = start.UnixNano()
	n := len(batch.Records)
	for i, rec := range batch.Records {
		if len(rec) > in.cfg.MaxRecordBytes {
			in.fail(w, http.StatusRequestEntityTooLarge, StatusTooLarge, wire.n,
				fmt.Sprintf("record %d is %d bytes, more than the limit of %d", i, len(rec), in.cfg.MaxRecordBytes))
			return
		}
	}
	claim, ok := in.claim(r.Context(), w, batch, wire.n)
	if !ok {
		return
	}
	// The batch is streamed into the spool straight from the request body
	// its records alias: no second copy in memory.
	err = in.spool.AppendPayload(r.Context(), spooledBatch{batch})
	claim.Release(err == nil)
	if err != nil {
		switch {
		case errors.Is(err, spool.ErrFull):
			in.fail(w, http.StatusServiceUnavailable, StatusUnavailable, wire.n, "spool is full, retry later")
		case errors.Is(err, spool.ErrNoSpace):
			in.fail(w, http.StatusServiceUnavailable, StatusUnavailable, wire.n, "spool disk is full, retry later")
		case errors.Is(err, spool.ErrTooLarge):
			in.fail(w, http.StatusRequestEntityTooLarge, StatusTooLarge, wire.n, "batch too large for the spool")
		default:
			in.log.Error("rtld: spooling a batch failed", "environment_id", env, "err", err)
			in.fail(w, http.StatusServiceUnavailable, StatusError, wire.n, "cannot store the batch, retry later")
		}
		return
	}
	in.metrics.batches.WithLabelValues(StatusAccepted).Inc()
	in.metrics.records.WithLabelValues(StatusAccepted).Add(float64(n))
	in.metrics.bytes.WithLabelValues(StatusAccepted).Add(float64(wire.n))
	if in.cfg.Observer != nil {
		in.cfg.Observer.ObserveSpooled(batch)
	}
	in.reply(w, http.StatusOK, map[string]any{"status": StatusAccepted, "records": n})
	in.metrics.ackLatency.Observe(time.Since(start).Seconds())
}

// claim claims the batch's identity for spooling. When the batch is
// already spooled, or cannot be checked in time, it answers the request
// and reports false.
func (in *Ingest) claim(ctx context.Context, w http.ResponseWriter, batch *accesslog.Batch, wire int64) (*BatchClaim, bool) {
	if in.dups == nil || !batch.HasIdentity() {
		return nil, true
	}
	// A copy being spooled by another request is waited for as long as
	// a slot or memory would be.
	claim, err := in.dups.Claim(ctx, batch, in.cfg.QueueWait)
	switch {
	case err == nil:
		return claim, true
	case errors.Is(err, ErrDuplicate):
		n := len(batch.Records)
		in.dups.CountDuplicate(batch.EnvironmentID, batch.AgentID)
		in.metrics.batches.WithLabelValues(StatusDuplicate).Inc()
		in.metrics.records.WithLabelValues(StatusDuplicate).Add(float64(n))
		in.metrics.bytes.WithLabelValues(StatusDuplicate).Add(float64(wire))
		in.reply(w, http.StatusOK, map[string]any{"status": StatusDuplicate, "records": n})
	default:
		in.fail(w, http.StatusServiceUnavailable, StatusUnavailable, wire, "cannot check the batch for duplicates: "+err.Error()+"; retry later")
	}
	return nil, false
}

// spooledBatch streams a batch into the spool in accesslog's encoding.
type spooledBatch struct{ b *accesslog.Batch }

func (s spooledBatch) Size() int                          { return accesslog.EncodedSize(s.b) }
func (s spooledBatch) WriteTo(w io.Writer) (int64, error) { return accesslog.EncodeTo(w, s.b) }

// wireBody is a request body as received, in chunks from the body memory.
type wireBody struct {
	chunks [][]byte
	n      int64
}

// reader reads the body back.
func (b wireBody) reader() io.Reader {
	rs := make([]io.Reader, len(b.chunks))
	for i, c := range b.chunks {
		rs[i] = bytes.NewReader(c)
	}
	return io.MultiReader(rs...)
}

// tail returns the body's last 4 bytes (gzip's ISIZE).
func (b wireBody) tail() (uint32, bool) {
	var t [4]byte
	i := 4
	for k := len(b.chunks) - 1; k >= 0 && i > 0; k-- {
		c := b.chunks[k]
		for j := len(c) - 1; j >= 0 && i > 0; j-- {
			i--
			t[i] = c[j]
		}
	}
	return binary.LittleEndian.Uint32(t[:]), i == 0
}

// receive reads the request body into chunks of the body memory within
// BodyTimeout. Memory for a chunk is taken only when bytes arrive for it.
func (in *Ingest) receive(w http.ResponseWriter, r *http.Request) (wireBody, error) {
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(in.cfg.BodyTimeout))
	body := http.MaxBytesReader(w, r.Body, in.cfg.MaxBodyBytes)
	var wb wireBody
	end := func(err error) (wireBody, error) {
		err = bodyReadError(err, wb.n)
		if err == nil {
			// The whole body is in: the rest of the request has the
			// server's own timeouts again.
			_ = rc.SetReadDeadline(time.Time{})
		}
		return wb, err
	}
	for {
		if len(wb.chunks) == 0 || len(wb.chunks[len(wb.chunks)-1]) == cap(wb.chunks[len(wb.chunks)-1]) {
			// Wait for the next byte before taking memory for it.
			var one [1]byte
			n, err := io.ReadFull(body, one[:])
			if n == 0 {
				return end(err)
			}
			c, err := in.mem.get(r.Context(), 1<<minBufferClass, in.cfg.QueueWait)
			if err != nil {
				return wb, err
			}
			wb.chunks = append(wb.chunks, append(c, one[0]))
			wb.n++
		}
		c := wb.chunks[len(wb.chunks)-1]
		n, err := body.Read(c[len(c):cap(c)])
		wb.chunks[len(wb.chunks)-1] = c[:len(c)+n]
		wb.n += int64(n)
		if err != nil {
			return end(err)
		}
	}
}

// errBodyCut marks a request body whose connection ended before the body
// did (fewer bytes than Content-Length, or a chunked body without its last
// chunk).
var errBodyCut = errors.New("request body cut short")

// bodyReadError maps the end of a body read after n bytes: nil at EOF.
func bodyReadError(err error, n int64) error {
	var ne net.Error
	switch {
	case errors.Is(err, io.EOF):
		return nil
	case errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("%w: the connection ended after %d bytes of the body", errBodyCut, n)
	case errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return errBodyTimeout
	}
	return err
}

// takeSlot takes an ingest slot, waiting up to QueueWait.
func (in *Ingest) takeSlot(ctx context.Context) bool {
	select {
	case in.sem <- struct{}{}:
		return true
	default:
	}
	t := time.NewTimer(in.cfg.QueueWait)
	defer t.Stop()
	select {
	case in.sem <- struct{}{}:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// decompress returns the decoded body in a buffer of the body memory,
// sized from gzip's trailer when there is one.
func (in *Ingest) decompress(ctx context.Context, wire wireBody, gzipped bool) ([]byte, error) {
	if !gzipped {
		buf, err := in.mem.get(ctx, max(wire.n, 1), in.cfg.QueueWait)
		if err != nil {
			return nil, err
		}
		for _, c := range wire.chunks {
			buf = append(buf, c...)
		}
		in.metrics.memory.Set(float64(in.mem.inFlight()))
		return buf, nil
	}
	zr, err := in.gzipReader(wire.reader())
	if err != nil {
		return nil, gzipError(err, wire.n)
	}
	defer in.gzPool.Put(zr)
	// ISIZE, the decompressed size (mod 2^32) of the last gzip member, sizes
	// the buffer (a wrong hint costs a copy, not safety). It is only a hint:
	// in a stream cut short the last 4 bytes are compressed data, so a value
	// above the limit starts from the smallest buffer instead of refusing
	// the body unread, and decompressing tells a bomb (413) from a truncated
	// upload (400).
	need := int64(1)
	if isize, ok := wire.tail(); ok && int64(isize) <= in.cfg.MaxDecodedBytes {
		need = int64(isize) + 1
	}
	buf, err := in.mem.get(ctx, need, in.cfg.QueueWait)
	if err != nil {
		return nil, err
	}
	in.metrics.memory.Set(float64(in.mem.inFlight()))
	for {
		if len(buf) == cap(buf) {
			if int64(len(buf)) > in.cfg.MaxDecodedBytes {
				in.release(buf)
				return nil, errDecodedTooLarge
			}
			bigger, err := in.mem.get(ctx, min(2*int64(cap(buf)), in.cfg.MaxDecodedBytes+1), in.cfg.QueueWait)
			if err != nil {
				in.release(buf)
				return nil, err
			}
			bigger = append(bigger, buf...)
			in.release(buf)
			buf = bigger
		}
		n, err := zr.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if int64(len(buf)) > in.cfg.MaxDecodedBytes {
			in.release(buf)
			return nil, errDecodedTooLarge
		}
		if errors.Is(err, io.EOF) {
			return buf, nil
		}
		if err != nil {
			in.release(buf)
			return nil, gzipError(err, wire.n)
		}
	}
}

// errTruncated marks a body that ends before its gzip stream does.
var errTruncated = errors.New("truncated")

// gzipError names what is wrong with a gzip body: a stream that ends
// early (an upload cut short) wraps errTruncated; every other error is
// returned as it is.
func gzipError(err error, wire int64) error {
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("gzip body is %w: the compressed stream ends after %d bytes, before its end marker and trailer (was the upload cut short?)", errTruncated, wire)
	case errors.Is(err, io.EOF) && wire == 0:
		return fmt.Errorf("gzip body is %w: it is empty", errTruncated)
	}
	return err
}

// release gives buffers back to the body memory.
func (in *Ingest) release(bufs ...[]byte) {
	if len(bufs) == 0 {
		return
	}
	for _, b := range bufs {
		in.mem.put(b)
	}
	in.metrics.memory.Set(float64(in.mem.inFlight()))
}

func (in *Ingest) gzipReader(r io.Reader) (*kgzip.Reader, error) {
	if zr, ok := in.gzPool.Get().(*kgzip.Reader); ok {
		if err := zr.Reset(r); err != nil {
			in.gzPool.Put(zr)
			return nil, err
		}
		return zr, nil
	}
	return kgzip.NewReader(r)
}

// bodyFailed answers a body that could not be received, decompressed or
// decoded.
func (in *Ingest) bodyFailed(w http.ResponseWriter, wire int64, err error) {
	var mbe *http.MaxBytesError
	var de *accesslog.DecodeError
	var ce flate.CorruptInputError
	switch {
	case errors.Is(err, errNoMemory):
		in.fail(w, http.StatusServiceUnavailable, StatusUnavailable, wire, "ingest memory is in use by other batches, retry later")
	case errors.Is(err, errBodyTimeout):
		// The connection is mid-body: answer and close it.
		w.Header().Set("Connection", "close")
		in.fail(w, http.StatusRequestTimeout, StatusMalformed, wire,
			fmt.Sprintf("request body not received within %s", in.cfg.BodyTimeout))
	case errors.As(err, &mbe):
		in.fail(w, http.StatusRequestEntityTooLarge, StatusTooLarge, wire,
			fmt.Sprintf("request body exceeds %d bytes", in.cfg.MaxBodyBytes))
	case errors.Is(err, errDecodedTooLarge):
		in.fail(w, http.StatusRequestEntityTooLarge, StatusTooLarge, wire,
			fmt.Sprintf("decompressed body exceeds %d bytes", in.cfg.MaxDecodedBytes))
	case errors.As(err, &de):
		in.metrics.batches.WithLabelValues(StatusMalformed).Inc()
		in.metrics.bytes.WithLabelValues(StatusMalformed).Add(float64(wire))
		off := de.Offset
		in.reply(w, http.StatusBadRequest, errorBody{Error: de.Error(), Status: http.StatusBadRequest, Line: de.Line, Offset: &off})
	case errors.Is(err, errTruncated), errors.Is(err, errBodyCut):
		in.fail(w, http.StatusBadRequest, StatusMalformed, wire, err.Error())
	case errors.Is(err, kgzip.ErrHeader), errors.Is(err, kgzip.ErrChecksum), errors.As(err, &ce):
		in.fail(w, http.StatusBadRequest, StatusMalformed, wire, "invalid gzip body: "+err.Error())
	default:
		in.fail(w, http.StatusBadRequest, StatusMalformed, wire, "reading the body: "+err.Error())
	}
}
