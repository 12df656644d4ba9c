// Package accesslog holds the receiver's data types, shared by ingest, the
// spool's readers, the sinks and the platform simulator: a decoded
// access-log Batch, its decoder for the platform's three JSON formats, its
// compact spool encoding, an allocation-free scanner of record objects, and
// the catalogue of log-field codes with their value types. It is a leaf: it
// imports nothing of edgepipe, so a sink depends on it without depending on
// the HTTP ingest, and the exporter (whose --simulate links the simulator)
// links no receiver code.
package accesslog

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"unicode/utf8"
)

// Format is the log_format of an RTLD http_post profile as seen on the wire.
type Format string

// The three JSON log formats the platform delivers.
const (
	// FormatJSON is an object carrying batch identity and a "logs" array.
	FormatJSON Format = "json"
	// FormatJSONArray is a bare array of record objects.
	FormatJSONArray Format = "json_array"
	// FormatJSONLines is one record object per line.
	FormatJSONLines Format = "json_lines"
)

// NoSeqNum marks a batch without a sequence number (json_array, json_lines).
const NoSeqNum int64 = -1

// Batch is one decoded delivery. Records are kept as the raw JSON of each
// record object, so that sinks never decode gzip or the envelope again.
type Batch struct {
	// EnvironmentID is the environment the batch was posted for (from the URL).
	EnvironmentID string
	// ReceivedUnixNano is when the receiver accepted the batch.
	ReceivedUnixNano int64
	// Format is the detected wire format.
	Format Format
	// AccountNumber, AgentID, Datestamp, Platform and ProfileID come from the
	// json envelope; they are empty for json_array and json_lines.
	AccountNumber string
	AgentID       string
	Datestamp     string
	Platform      string
	ProfileID     string
	// SeqNum is the batch's seq_num, or NoSeqNum without batch identity.
	SeqNum int64
	// Records holds each record object's JSON, in delivery order.
	Records []json.RawMessage
	// RecordIndexes, when not nil, holds the position each of Records had in
	// the batch as delivered: a batch narrowed by Select (or rebuilt from a
	// dead letter) keeps its records' identities. Nil means Records is the
	// whole batch in order. Read it through RecordIndex.
	RecordIndexes []int
	// BatchHash, when not empty, is the ContentHash of the whole batch as
	// delivered (Select sets it, since a part hashes differently).
	BatchHash string
}

// RecordIndex returns the position Records[i] had in the batch as
// delivered: i, unless the batch was narrowed by Select.
func (b *Batch) RecordIndex(i int) int {
	if b.RecordIndexes != nil {
		return b.RecordIndexes[i]
	}
	return i
}

// Select returns a batch with the same metadata holding only Records[i] for
// each i of idx, in that order. Its records keep their identity: RecordIndex
// answers as for b, and so does ContentHash when b has no identity (the
// only batches whose records it names). Records alias b's.
func (b *Batch) Select(idx ...int) *Batch {
	out := *b
	out.Records = make([]json.RawMessage, len(idx))
	out.RecordIndexes = make([]int, len(idx))
	for k, i := range idx {
		out.Records[k] = b.Records[i]
		out.RecordIndexes[k] = b.RecordIndex(i)
	}
	if !b.HasIdentity() {
		out.BatchHash = b.ContentHash()
	}
	return &out
}

// HasIdentity reports whether (agent, datestamp, seq_num) name this batch.
func (b *Batch) HasIdentity() bool { return b.Format == FormatJSON && b.SeqNum >= 0 && b.AgentID != "" }

// RecordBytes is the total size of the records' JSON.
func (b *Batch) RecordBytes() int {
	n := 0
	for _, r := range b.Records {
		n += len(r)
	}
	return n
}

// DecodeError is returned by Decode for input that is not a valid batch.
// Offset is the byte offset in the decoded (gunzipped) body where the problem
// was found; Line is its 1-based line number when known (0 otherwise).
type DecodeError struct {
	Format Format
	Offset int64
	Line   int
	Msg    string
	Err    error
}

// Error implements error.
func (e *DecodeError) Error() string {
	var b bytes.Buffer
	b.WriteString("invalid batch")
	if e.Format != "" {
		fmt.Fprintf(&b, " (%s)", e.Format)
	}
	if e.Line > 0 {
		fmt.Fprintf(&b, " at line %d", e.Line)
	}
	fmt.Fprintf(&b, " at offset %d: %s", e.Offset, e.Msg)
	if e.Err != nil {
		fmt.Fprintf(&b, ": %v", e.Err)
	}
	return b.String()
}

// Unwrap returns the underlying cause.
func (e *DecodeError) Unwrap() error { return e.Err }

// ErrEmptyBatch is wrapped by a DecodeError for a body without any record.
var ErrEmptyBatch = errors.New("batch holds no records")

// ErrInvalidUTF8 is wrapped by a DecodeError for a body holding bytes that
// are not UTF-8 (JSON text must be UTF-8; records go to sinks byte for byte).
var ErrInvalidUTF8 = errors.New("invalid UTF-8")

// invalidUTF8 returns the offset of the first byte of b that does not start
// a valid UTF-8 sequence, or -1 when b is valid UTF-8.
func invalidUTF8(b []byte) int {
	if utf8.Valid(b) {
		return -1
	}
	for i := 0; i < len(b); {
		if b[i] < utf8.RuneSelf {
			i++
			continue
		}
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n <= 1 {
			return i
		}
		i += n
	}
	return -1
}

// lineCounter counts newlines of everything read through it, so errors can
// name a line without keeping the body.
type lineCounter struct {
	r     io.Reader
	lines int   // newlines seen
	read  int64 // bytes read
	// nlOffsets holds the offsets of the most recent newlines; enough to map
	// a decoder offset (which lags the read position by the decoder's
	// buffer) back to a line number.
	nlOffsets []int64
}

func (c *lineCounter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	for i := 0; i < n; {
		j := bytes.IndexByte(p[i:n], '\n')
		if j < 0 {
			break
		}
		c.lines++
		c.nlOffsets = append(c.nlOffsets, c.read+int64(i+j))
		if len(c.nlOffsets) > 4096 {
			c.nlOffsets = append(c.nlOffsets[:0], c.nlOffsets[2048:]...)
		}
		i += j + 1
	}
	c.read += int64(n)
	return n, err
}

// lineAt returns the 1-based line of byte offset off, or 0 when it is no
// longer known.
func (c *lineCounter) lineAt(off int64) int {
	after := 0 // newlines at or after off among those remembered
	for i := len(c.nlOffsets) - 1; i >= 0 && c.nlOffsets[i] >= off; i-- {
		after++
	}
	if after == len(c.nlOffsets) && c.lines > len(c.nlOffsets) {
		return 0
	}
	return c.lines - after + 1
}

// Decode decodes one delivery body (already gunzipped) for environment
// env. The format is detected from the shape: an object with a "logs" member
// is json, an array is json_array, and a stream of objects is json_lines.
// Errors from r (for example a size limit) are returned wrapped, so callers
// can test them with errors.Is; every other problem is a *DecodeError. The
// whole body is read first (bound r's size), and the records alias it.
func Decode(env string, r io.Reader) (*Batch, error) {
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(r); err != nil {
		return nil, fmt.Errorf("reading batch: %w", err)
	}
	return DecodeBytes(env, buf.Bytes())
}

// DecodeBytes is Decode for a body in memory; the records alias
// body. Valid input takes a fast path (validating scans for UTF-8 and JSON,
// then an allocation-free split); invalid input is decoded again by a
// streaming decoder that names the line and offset of the problem. Both
// refuse bytes that are not UTF-8 (ErrInvalidUTF8).
func DecodeBytes(env string, body []byte) (*Batch, error) {
	if b, ok := decodeFast(env, body); ok {
		return b, nil
	}
	return decodeStream(env, bytes.NewReader(body))
}

// decodeFast handles well-formed batches; it reports false for anything it
// does not accept, which the streaming decoder then explains.
func decodeFast(env string, body []byte) (*Batch, bool) {
	i := skipSpace(body, 0)
	if i == len(body) || !utf8.Valid(body) {
		return nil, false
	}
	b := &Batch{EnvironmentID: env, SeqNum: NoSeqNum}
	switch body[i] {
	case '[':
		return b, b.fastArray(body, i)
	case '{':
		if ok, whole := b.fastObject(body, i); whole {
			return b, ok
		}
		return b, b.fastLines(body)
	}
	return nil, false
}

// fastArray decodes a json_array body whose array starts at body[i].
func (b *Batch) fastArray(body []byte, i int) bool {
	b.Format = FormatJSONArray
	ok := true
	end := scanElements(body, i, 0, func(v []byte) {
		ok = ok && v[0] == '{'
		b.Records = append(b.Records, v)
	})
	return end >= 0 && skipSpace(body, end) == len(body) && ok && len(b.Records) > 0
}

// fastObject decodes a body that is one object starting at body[i]: a json
// envelope, or a json_lines batch of one record. whole is false when the
// body is not one valid object (json_lines of several records, or invalid).
func (b *Batch) fastObject(body []byte, i int) (ok, whole bool) {
	w, end := splitObject(body, i)
	if end < 0 || skipSpace(body, end) != len(body) {
		return false, false
	}
	if w.Logs == nil || string(w.Logs) == "null" {
		b.Format = FormatJSONLines
		b.Records = []json.RawMessage{body[i:end]}
		return true, true
	}
	env, err := w.envelope()
	if err != nil || len(env.Logs) == 0 {
		return false, true
	}
	b.Format = FormatJSON
	b.AccountNumber, b.AgentID, b.Datestamp = env.AccountNumber, env.AgentID, env.Datestamp
	b.Platform, b.ProfileID, b.SeqNum, b.Records = env.Platform, env.ProfileID, env.SeqNum, env.Logs
	return true, true
}

// fastLines decodes a json_lines body: one object per line.
func (b *Batch) fastLines(body []byte) bool {
	b.Format = FormatJSONLines
	for rest := body; len(rest) > 0; {
		line := rest
		if nl := bytes.IndexByte(rest, '\n'); nl >= 0 {
			line, rest = rest[:nl], rest[nl+1:]
		} else {
			rest = nil
		}
		line = bytes.Trim(line, " \t\r\n")
		if len(line) == 0 {
			continue
		}
		if line[0] != '{' || !validJSON(line) {
			return false
		}
		b.Records = append(b.Records, line)
	}
	if len(b.Records) == 0 {
		return false
	}
	_, isEnvelope, _ := parseEnvelope(b.Records[0])
	return !isEnvelope // an envelope followed by more: let the stream decoder say so
}

// decodeStream decodes with encoding/json's streaming decoder, which knows
// where a problem is.
func decodeStream(env string, r io.Reader) (*Batch, error) {
	lc := &lineCounter{r: r}
	br := bufio.NewReaderSize(lc, 32<<10)
	// Sniff the first non-space byte.
	var first byte
	var skipped int64
	for {
		c, err := br.ReadByte()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil, &DecodeError{Offset: skipped, Msg: "empty body", Err: ErrEmptyBatch}
			}
			return nil, fmt.Errorf("reading batch: %w", err)
		}
		if c == ' ' || c == '\t' || c == '\n' || c == '\r' {
			skipped++
			continue
		}
		if err := br.UnreadByte(); err != nil {
			return nil, fmt.Errorf("reading batch: %w", err)
		}
		first = c
		break
	}
	d := &decoder{lc: lc, dec: json.NewDecoder(br), base: skipped, b: &Batch{EnvironmentID: env, SeqNum: NoSeqNum}}
	var err error
	switch first {
	case '[':
		d.b.Format = FormatJSONArray
		err = d.array()
	case '{':
		err = d.object()
	default:
		return nil, &DecodeError{Offset: skipped, Line: lc.lineAt(skipped), Msg: fmt.Sprintf("unexpected %q, want a JSON object or array", first)}
	}
	if err != nil {
		return nil, err
	}
	if len(d.b.Records) == 0 {
		return nil, &DecodeError{Format: d.b.Format, Offset: d.offset(), Msg: "no records", Err: ErrEmptyBatch}
	}
	return d.b, nil
}

type decoder struct {
	lc   *lineCounter
	dec  *json.Decoder
	base int64 // bytes skipped before the decoder started
	b    *Batch
}

func (d *decoder) offset() int64 { return d.base + d.dec.InputOffset() }

// fail turns err into a *DecodeError, unless it came from the reader.
func (d *decoder) fail(err error, msg string) error {
	off := d.offset()
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		off = d.base + se.Offset
		msg = "malformed JSON"
	case errors.As(err, &te):
		off = d.base + te.Offset
	case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
		msg = "unexpected end of input"
	case err != nil:
		// A reader error (size limit, broken gzip stream): not the client's JSON.
		return fmt.Errorf("decoding %s batch: %w", d.b.Format, err)
	}
	return &DecodeError{Format: d.b.Format, Offset: off, Line: d.lc.lineAt(off), Msg: msg, Err: err}
}

func (d *decoder) failf(format string, a ...any) error {
	off := d.offset()
	return &DecodeError{Format: d.b.Format, Offset: off, Line: d.lc.lineAt(off), Msg: fmt.Sprintf(format, a...)}
}

// checkUTF8 fails when raw, the value the decoder just read, holds bytes
// that are not UTF-8 (encoding/json lets them through in strings and keys).
func (d *decoder) checkUTF8(raw []byte) error {
	i := invalidUTF8(raw)
	if i < 0 {
		return nil
	}
	off := d.offset() - int64(len(raw)) + int64(i)
	return &DecodeError{Format: d.b.Format, Offset: off, Line: d.lc.lineAt(off), Msg: "JSON text must be UTF-8", Err: ErrInvalidUTF8}
}

// record decodes one array element or stream value and checks it is an object.
func (d *decoder) record() error {
	var raw json.RawMessage
	if err := d.dec.Decode(&raw); err != nil {
		return d.fail(err, "decoding record")
	}
	if err := d.checkUTF8(raw); err != nil {
		return err
	}
	if len(raw) == 0 || raw[0] != '{' {
		return d.failf("record %d is not a JSON object", len(d.b.Records))
	}
	d.b.Records = append(d.b.Records, raw)
	return nil
}

func (d *decoder) delim(want json.Delim) error {
	tok, err := d.dec.Token()
	if err != nil {
		return d.fail(err, "reading token")
	}
	if got, ok := tok.(json.Delim); !ok || got != want {
		return d.failf("expected %q", string(want))
	}
	return nil
}

func (d *decoder) array() error {
	if err := d.delim('['); err != nil {
		return err
	}
	for d.dec.More() {
		if err := d.record(); err != nil {
			return err
		}
	}
	if err := d.delim(']'); err != nil {
		return err
	}
	return d.end()
}

// end checks that only whitespace follows the value.
func (d *decoder) end() error {
	tok, err := d.dec.Token()
	if errors.Is(err, io.EOF) {
		return nil
	}
	if err != nil {
		return d.fail(err, "after the batch")
	}
	return d.failf("unexpected %v after the batch", tok)
}

// object decodes either the json envelope or the first json_lines record.
// Members are read one by one so the logs array is streamed, not buffered
// twice; an object without "logs" but with other members is a record.
func (d *decoder) object() error {
	var first json.RawMessage
	if err := d.dec.Decode(&first); err != nil {
		// Malformed first value: report it as json_lines or json, whichever
		// the text suggests.
		d.b.Format = FormatJSONLines
		return d.fail(err, "decoding first object")
	}
	env, isEnvelope, err := parseEnvelope(first)
	if err != nil {
		d.b.Format = FormatJSON
		return &DecodeError{Format: FormatJSON, Offset: d.base, Line: d.lc.lineAt(d.base), Msg: err.Error()}
	}
	d.b.Format = FormatJSON
	if !isEnvelope {
		d.b.Format = FormatJSONLines
	}
	if err := d.checkUTF8(first); err != nil {
		return err
	}
	if !isEnvelope {
		d.b.Records = append(d.b.Records, first)
		for d.dec.More() {
			if err := d.record(); err != nil {
				return err
			}
		}
		return d.end()
	}
	d.b.Format = FormatJSON
	d.b.AccountNumber = env.AccountNumber
	d.b.AgentID = env.AgentID
	d.b.Datestamp = env.Datestamp
	d.b.Platform = env.Platform
	d.b.ProfileID = env.ProfileID
	d.b.SeqNum = env.SeqNum
	d.b.Records = env.Logs
	return d.end()
}

type envelope struct {
	AccountNumber string
	AgentID       string
	Datestamp     string
	Platform      string
	ProfileID     string
	SeqNum        int64
	Logs          []json.RawMessage
}

// wireEnvelope is the json format's envelope with every member kept raw, so
// that a json_lines record which happens to use one of these keys is not
// rejected before it is known to be a record.
type wireEnvelope struct {
	AccountNumber, AgentID, Datestamp, Platform, ProfileID, SeqNum, Logs json.RawMessage
	// logs holds the elements of Logs when it is an array; badLog is the
	// index of the first that is not an object, or -1.
	logs   []json.RawMessage
	badLog int
}

// member keeps the value v of the member named key (the members the
// envelope knows; the last of a repeated one counts).
func (w *wireEnvelope) member(key string, v json.RawMessage) {
	switch key {
	case "logs":
		w.Logs = v
	case "account_number":
		w.AccountNumber = v
	case "agent_id":
		w.AgentID = v
	case "datestamp":
		w.Datestamp = v
	case "platform":
		w.Platform = v
	case "profile_id":
		w.ProfileID = v
	case "seq_num":
		w.SeqNum = v
	}
}

// splitObject validates the object at body[i] == '{' in one pass, keeping
// the envelope's members and splitting "logs" into its elements. It returns
// the index after the object, or -1 when it is not valid JSON.
func splitObject(body []byte, i int) (wireEnvelope, int) {
	w := wireEnvelope{badLog: -1}
	end := scanMembers(body, i, func(key []byte, escaped bool, v int) int {
		k := string(key) // no copy: only compared, or stored after unescaping
		if escaped {
			k = UnescapeKey(key, escaped)
		}
		if k == "logs" && v < len(body) && body[v] == '[' {
			w.logs, w.badLog = w.logs[:0], -1
			e := scanElements(body, v, 1, func(r []byte) {
				if w.badLog < 0 && r[0] != '{' {
					w.badLog = len(w.logs)
				}
				w.logs = append(w.logs, r)
			})
			if e >= 0 {
				w.Logs = body[v:e]
			}
			return e
		}
		e := scanValueDepth(body, v, 1)
		if e >= 0 {
			w.member(k, body[v:e])
		}
		return e
	})
	return w, end
}

// parseEnvelope decodes the json format's envelope. It reports false when obj
// has no "logs" member (it is then a json_lines record). obj must be valid
// JSON (the decoder checked it); the records alias it.
func parseEnvelope(obj json.RawMessage) (envelope, bool, error) {
	w := wireEnvelope{badLog: -1}
	if err := EachMember(obj, func(key []byte, escaped bool, v []byte) {
		w.member(UnescapeKey(key, escaped), v)
	}); err != nil {
		return envelope{}, false, fmt.Errorf("decoding object: %w", err)
	}
	if len(w.Logs) == 0 || string(w.Logs) == "null" {
		return envelope{}, false, nil
	}
	if w.Logs[0] == '[' {
		if err := EachElement(w.Logs, func(v []byte) {
			if w.badLog < 0 && v[0] != '{' {
				w.badLog = len(w.logs)
			}
			w.logs = append(w.logs, v)
		}); err != nil {
			return envelope{SeqNum: NoSeqNum}, true, fmt.Errorf(`decoding "logs": %w`, err)
		}
	}
	e, err := w.envelope()
	return e, true, err
}

// envelope checks and decodes the members of an envelope whose "logs" is
// set and not null.
func (w *wireEnvelope) envelope() (envelope, error) {
	e := envelope{SeqNum: NoSeqNum}
	if w.Logs[0] != '[' {
		return e, errors.New(`"logs" must be an array of record objects`)
	}
	e.Logs = w.logs
	if w.badLog >= 0 {
		return e, fmt.Errorf("logs[%d] is not a JSON object", w.badLog)
	}
	str := func(key string, raw json.RawMessage, dst *string) error {
		if len(raw) == 0 || string(raw) == "null" {
			return nil
		}
		if raw[0] == '"' {
			return json.Unmarshal(raw, dst)
		}
		// Numbers (profile_id is numeric on the wire) are kept verbatim.
		if _, err := strconv.ParseFloat(string(raw), 64); err == nil {
			*dst = string(raw)
			return nil
		}
		return fmt.Errorf("%q must be a string or a number", key)
	}
	for _, f := range []struct {
		key string
		raw json.RawMessage
		dst *string
	}{
		{"account_number", w.AccountNumber, &e.AccountNumber}, {"agent_id", w.AgentID, &e.AgentID},
		{"datestamp", w.Datestamp, &e.Datestamp}, {"platform", w.Platform, &e.Platform},
		{"profile_id", w.ProfileID, &e.ProfileID},
	} {
		if err := str(f.key, f.raw, f.dst); err != nil {
			return e, err
		}
	}
	if len(w.SeqNum) > 0 && string(w.SeqNum) != "null" {
		n, err := strconv.ParseInt(string(w.SeqNum), 10, 64)
		if err != nil || n < 0 {
			return e, fmt.Errorf(`"seq_num" must be a non-negative integer, got %s`, truncate(w.SeqNum, 32))
		}
		e.SeqNum = n
	}
	if e.Datestamp != "" && !validDatestamp(e.Datestamp) {
		return e, fmt.Errorf(`"datestamp" must be YYYYMMDD, got %q`, truncate([]byte(e.Datestamp), 32))
	}
	return e, nil
}

func validDatestamp(s string) bool {
	if len(s) != 8 {
		return false
	}
	for i := 0; i < 8; i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

// ContentHash is a stable identity for a batch without one (json_array,
// json_lines): the SHA-256 of its records, hex, 32 characters. The platform
// resends a failed batch with the same bytes, so a redelivery has the same
// hash. A batch narrowed by Select returns the hash of the whole batch.
func (b *Batch) ContentHash() string {
	if b.BatchHash != "" {
		return b.BatchHash
	}
	h := sha256.New()
	for _, r := range b.Records {
		h.Write(r)
		h.Write([]byte{'\n'})
	}
	return hex.EncodeToString(h.Sum(nil))[:32]
}
