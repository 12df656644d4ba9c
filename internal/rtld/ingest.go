// Package rtld is edgepipe's real-time log delivery receiver: the ingest
// source that accepts the platform's access-log batches, the gap detector and
// the profile registrar. The data types live in rtld/logbatch, the spool in
// rtld/spool, the delivery workers in rtld/delivery; rtld/receiver wires them.
package rtld

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
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
	DefaultMaxInFlight     = 16
	DefaultMaxRecordBytes  = 512 << 10
	DefaultRetryAfter      = 5 * time.Second
)

// IngestConfig configures the ingest source.
type IngestConfig struct {
	// Username and Password are the HTTP basic credentials every batch must
	// carry (the ones written into the profiles).
	Username, Password string
	// MaxBodyBytes bounds the request body as sent (gzip); 413 beyond.
	MaxBodyBytes int64
	// MaxDecodedBytes bounds the body after decompression; 413 beyond. It
	// also bounds the memory one request can use (about 3× this).
	MaxDecodedBytes int64
	// MaxRecordBytes bounds one record's JSON; a batch holding a bigger one
	// is refused with 413 rather than accepted and then stuck forever in
	// front of a sink that cannot take it (Kafka's message.max.bytes).
	MaxRecordBytes int
	// MaxInFlight is how many requests are processed at once; beyond it the
	// answer is 503 with Retry-After.
	MaxInFlight int
	// RetryAfter is the Retry-After sent with 503 answers.
	RetryAfter time.Duration
	// AllowEnvironment reports whether batches for an environment are
	// accepted (404 otherwise). Nil accepts every environment.
	AllowEnvironment func(environmentID string) bool
}

// Spooler is what ingest needs from the spool.
type Spooler interface {
	Append(ctx context.Context, data []byte) error
	Full() bool
}

// DuplicateChecker is what ingest needs from the gap tracker: whether a
// batch with identity was already spooled, and counting a dropped duplicate.
type DuplicateChecker interface {
	Seen(b *accesslog.Batch) bool
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
	userHash [32]byte
	passHash [32]byte
	gzPool   sync.Pool
}

// NewIngest returns the ingest source writing to sp. dups may be nil.
func NewIngest(cfg IngestConfig, sp Spooler, dups DuplicateChecker, m *Metrics, log *slog.Logger) *Ingest {
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.MaxDecodedBytes <= 0 {
		cfg.MaxDecodedBytes = DefaultMaxDecodedBytes
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	if cfg.MaxRecordBytes <= 0 {
		cfg.MaxRecordBytes = DefaultMaxRecordBytes
	}
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = DefaultRetryAfter
	}
	if log == nil {
		log = slog.Default()
	}
	return &Ingest{
		cfg: cfg, spool: sp, dups: dups, metrics: m, log: log,
		sem:      make(chan struct{}, cfg.MaxInFlight),
		userHash: sha256.Sum256([]byte(cfg.Username)),
		passHash: sha256.Sum256([]byte(cfg.Password)),
	}
}

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

// limitReader returns errDecodedTooLarge once more than n bytes were read,
// so overflow is told apart from a body that ends exactly at the limit.
type limitReader struct {
	r io.Reader
	n int64
}

func (l *limitReader) Read(p []byte) (int, error) {
	if l.n < 0 {
		return 0, errDecodedTooLarge
	}
	if int64(len(p)) > l.n+1 {
		p = p[:l.n+1]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	if l.n < 0 {
		return n, errDecodedTooLarge
	}
	return n, err
}

// countingReader counts the wire bytes read.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

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

// ServeHTTP handles one batch.
func (in *Ingest) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	in.metrics.inFlight.Inc()
	defer in.metrics.inFlight.Dec()

	if !in.authorized(r) {
		w.Header().Set("WWW-Authenticate", `Basic realm="edgepipe", charset="UTF-8"`)
		in.fail(w, http.StatusUnauthorized, StatusUnauthorized, 0, "missing or wrong credentials")
		return
	}
	select {
	case in.sem <- struct{}{}:
		defer func() { <-in.sem }()
	default:
		in.fail(w, http.StatusServiceUnavailable, StatusUnavailable, 0, "too many requests in flight, retry later")
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
	wire := &countingReader{r: http.MaxBytesReader(w, r.Body, in.cfg.MaxBodyBytes)}
	var body io.Reader = wire
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip", "x-gzip":
		zr, err := in.gzipReader(wire)
		if err != nil {
			in.decodeFailed(w, wire.n, err)
			return
		}
		defer in.gzPool.Put(zr)
		body = zr
	default:
		in.fail(w, http.StatusUnsupportedMediaType, StatusMalformed, wire.n, fmt.Sprintf("unsupported Content-Encoding %q (gzip or identity)", enc))
		return
	}
	batch, err := accesslog.Decode(env, &limitReader{r: body, n: in.cfg.MaxDecodedBytes})
	if err != nil {
		in.decodeFailed(w, wire.n, err)
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
	if in.dups != nil && batch.HasIdentity() && in.dups.Seen(batch) {
		in.dups.CountDuplicate(env, batch.AgentID)
		in.metrics.batches.WithLabelValues(StatusDuplicate).Inc()
		in.metrics.records.WithLabelValues(StatusDuplicate).Add(float64(n))
		in.metrics.bytes.WithLabelValues(StatusDuplicate).Add(float64(wire.n))
		in.reply(w, http.StatusOK, map[string]any{"status": StatusDuplicate, "records": n})
		return
	}
	if err := in.spool.Append(r.Context(), accesslog.Marshal(batch)); err != nil {
		switch {
		case errors.Is(err, spool.ErrFull):
			in.fail(w, http.StatusServiceUnavailable, StatusUnavailable, wire.n, "spool is full, retry later")
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
	in.reply(w, http.StatusOK, map[string]any{"status": StatusAccepted, "records": n})
	in.metrics.ackLatency.Observe(time.Since(start).Seconds())
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

// decodeFailed answers a body that could not be read or decoded.
func (in *Ingest) decodeFailed(w http.ResponseWriter, wire int64, err error) {
	var mbe *http.MaxBytesError
	var de *accesslog.DecodeError
	var ce flate.CorruptInputError
	switch {
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
	case errors.Is(err, kgzip.ErrHeader), errors.Is(err, kgzip.ErrChecksum), errors.As(err, &ce),
		errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		in.fail(w, http.StatusBadRequest, StatusMalformed, wire, "invalid gzip body: "+err.Error())
	default:
		in.fail(w, http.StatusBadRequest, StatusMalformed, wire, "reading the body: "+err.Error())
	}
}
