package kafka

import (
	"errors"
	"fmt"
	"strings"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/edgepipe/edgepipe/internal/rtld/delivery"
)

// DefaultMaxMessageBytes is the default of Config.MaxMessageBytes: 1 MiB,
// the broker's default message.max.bytes (1 MiB + 12 bytes of log overhead).
const DefaultMaxMessageBytes = 1 << 20

// recordBatchOverhead is the size of a record batch's header (Kafka message
// format v2): the broker compares the whole batch with its limit.
const recordBatchOverhead = 61

// messageBytes is the size the broker sees for m alone in a record batch:
// kafka-go's estimate of the message (which the writer also compares with
// BatchBytes, and which is never below the v2 record encoding) plus the
// batch header. Compression can only shrink it, except for incompressible
// data within a few hundred bytes of the limit, which the broker then
// refuses and the worker dead-letters.
func messageBytes(m *kafkago.Message) int64 {
	n := int64(4 + 1 + 1 + 8 + 4 + len(m.Key) + 4 + len(m.Value)) // kafka-go's Message.size
	n += varintLen(int64(len(m.Headers)))
	for _, h := range m.Headers {
		n += varintLen(int64(len(h.Key))) + int64(len(h.Key)) + varintLen(int64(len(h.Value))) + int64(len(h.Value))
	}
	return n + recordBatchOverhead
}

// varintLen is the length of a zig-zag varint, as the Kafka protocol
// encodes lengths in records.
func varintLen(v int64) int64 {
	u := uint64((v << 1) ^ (v >> 63))
	n := int64(1)
	for u >= 0x80 {
		u >>= 7
		n++
	}
	return n
}

// class is what an error means for the records of a produce request.
type class struct {
	// permanent: sending the record again unchanged fails again.
	permanent bool
	// each: the error concerns every record on its own (the topic refuses
	// them all); otherwise it may be caused by some records of the request
	// only, and the worker splits the request to find them.
	each   bool
	reason string
}

const rejectTooLarge = "message_too_large"

// classify maps a kafka-go error to a class. Errors about the records
// (MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE, INVALID_RECORD,
// INVALID_TIMESTAMP, POLICY_VIOLATION) and about the topic
// (INVALID_TOPIC_EXCEPTION, TOPIC_AUTHORIZATION_FAILED,
// UNSUPPORTED_FOR_MESSAGE_FORMAT, UNSUPPORTED_COMPRESSION_TYPE) are
// permanent; everything else (leader moves, timeouts, not enough replicas,
// connection and SASL failures, unknown topics the broker may still create)
// is worth retrying.
func classify(err error) class {
	var ke kafkago.Error
	if !errors.As(err, &ke) {
		return class{}
	}
	switch ke {
	case kafkago.MessageSizeTooLarge:
		return class{permanent: true, reason: rejectTooLarge}
	case kafkago.RecordListTooLarge, kafkago.InvalidRecord, kafkago.InvalidTimestamp, kafkago.PolicyViolation:
		return class{permanent: true, reason: reasonOf(ke)}
	case kafkago.InvalidTopic, kafkago.TopicAuthorizationFailed, kafkago.UnsupportedForMessageFormat, kafkago.UnsupportedCompressionType:
		return class{permanent: true, each: true, reason: reasonOf(ke)}
	}
	return class{}
}

// reasonOf turns a Kafka error's title into a metric label value
// ("Topic Authorization Failed" → topic_authorization_failed).
func reasonOf(e kafkago.Error) string {
	return strings.ReplaceAll(strings.ToLower(e.Title()), " ", "_")
}

// refusals collects the records Kafka refused for good, by reason.
type refusals struct {
	order []string
	by    map[string]*delivery.RejectedError
}

func (r *refusals) add(ref delivery.RecordRef, reason string, err error) {
	r.addClass(ref, class{permanent: true, each: true, reason: reason}, err)
}

func (r *refusals) addClass(ref delivery.RecordRef, c class, err error) {
	key := fmt.Sprintf("%s/%v", c.reason, c.each)
	if r.by == nil {
		r.by = map[string]*delivery.RejectedError{}
	}
	e := r.by[key]
	if e == nil {
		e = &delivery.RejectedError{Records: []delivery.RecordRef{}, Each: c.each, Reason: c.reason, Err: err}
		r.by[key] = e
		r.order = append(r.order, key)
	}
	e.Records = append(e.Records, ref)
}

// err returns nil when nothing was refused, or the refusals joined.
func (r *refusals) err() error {
	var errs []error
	for _, k := range r.order {
		errs = append(errs, r.by[k])
	}
	return errors.Join(errs...)
}
