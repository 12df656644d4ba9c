package kafka

import (
	"strconv"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/edgepipe/edgepipe/internal/accesslog"
	"github.com/edgepipe/edgepipe/internal/rtld/delivery"
)

// Message header names. HeaderRecordID is the one to deduplicate on.
const (
	HeaderEnvironmentID = "environment_id"
	HeaderFormat        = "format"
	HeaderProfileID     = "profile_id"
	HeaderAgentID       = "agent_id"
	HeaderDatestamp     = "datestamp"
	HeaderSeqNum        = "seq_num"
	HeaderRecordIndex   = "record_index"
	HeaderRecordID      = "record_id"
)

// batchKey is the message key of every record of b: the environment and
// agent (an agent's records stay in one partition, in order), or for a
// batch without identity the environment and its content hash.
func batchKey(b *accesslog.Batch) []byte {
	if b.AgentID != "" {
		return []byte(b.EnvironmentID + "/" + b.AgentID)
	}
	return []byte(b.EnvironmentID + "/" + b.ContentHash())
}

// RecordID returns the record_id header of b's record i: the same string
// every time the record is delivered, whatever crashed or was retried in
// between, and different for every other record.
//
//   - batch with identity (log format json):
//     <environment_id>/<profile_id>/<agent_id>/<datestamp>/<seq_num>/<record_index>
//   - otherwise, a record with a "uuid" string: <environment_id>/uuid:<uuid>
//   - otherwise: <environment_id>/batch:<content hash>/<record_index>
//
// It names a record as ClickHouse's access_logs identity does (the same
// fields), so Kafka consumers and the table agree on what one record is.
func RecordID(b *accesslog.Batch, i int) string {
	return string(appendRecordID(nil, b, i, idHash(b)))
}

// idHash is the content hash record ids of b need: "" for a batch with
// identity (they do not use it).
func idHash(b *accesslog.Batch) string {
	if b.HasIdentity() {
		return ""
	}
	return b.ContentHash()
}

// appendRecordID appends RecordID(b, i) to dst; hash is idHash(b).
func appendRecordID(dst []byte, b *accesslog.Batch, i int, hash string) []byte {
	dst = append(dst, b.EnvironmentID...)
	dst = append(dst, '/')
	if b.HasIdentity() {
		dst = appendIdentityPrefix(dst, b)
		return strconv.AppendInt(dst, int64(b.RecordIndex(i)), 10)
	}
	if u := accesslog.RecordUUID(b.Records[i]); u != "" {
		dst = append(dst, "uuid:"...)
		return append(dst, u...)
	}
	dst = append(dst, "batch:"...)
	dst = append(dst, hash...)
	dst = append(dst, '/')
	return strconv.AppendInt(dst, int64(b.RecordIndex(i)), 10)
}

// appendIdentityPrefix appends "<profile_id>/<agent_id>/<datestamp>/<seq_num>/".
func appendIdentityPrefix(dst []byte, b *accesslog.Batch) []byte {
	dst = append(dst, b.ProfileID...)
	dst = append(dst, '/')
	dst = append(dst, b.AgentID...)
	dst = append(dst, '/')
	dst = append(dst, b.Datestamp...)
	dst = append(dst, '/')
	dst = strconv.AppendInt(dst, b.SeqNum, 10)
	return append(dst, '/')
}

// messages turns batches into Kafka messages, and names the record of each
// (RecordRef.Batch is index[k] for batches[k], or k when index is nil).
func messages(batches []*accesslog.Batch, index []int) ([]kafkago.Message, []delivery.RecordRef) {
	n := 0
	for _, b := range batches {
		n += len(b.Records)
	}
	msgs := make([]kafkago.Message, 0, n)
	refs := make([]delivery.RecordRef, 0, n)
	for k, b := range batches {
		bi := k
		if index != nil {
			bi = index[k]
		}
		msgs = appendMessages(msgs, b)
		for i := range b.Records {
			refs = append(refs, delivery.RecordRef{Batch: bi, Record: i})
		}
	}
	return msgs, refs
}

// appendMessages appends one message per record of b. The headers of all
// records and their record_index and record_id values take one allocation
// each for the whole batch.
func appendMessages(msgs []kafkago.Message, b *accesslog.Batch) []kafkago.Message {
	if len(b.Records) == 0 {
		return msgs
	}
	hash := idHash(b)
	var key []byte
	if b.AgentID != "" {
		key = []byte(b.EnvironmentID + "/" + b.AgentID)
	} else {
		key = []byte(b.EnvironmentID + "/" + b.ContentHash())
	}
	base := []kafkago.Header{
		{Key: HeaderEnvironmentID, Value: []byte(b.EnvironmentID)},
		{Key: HeaderFormat, Value: []byte(b.Format)},
	}
	if b.ProfileID != "" {
		base = append(base, kafkago.Header{Key: HeaderProfileID, Value: []byte(b.ProfileID)})
	}
	if b.AgentID != "" {
		base = append(base, kafkago.Header{Key: HeaderAgentID, Value: []byte(b.AgentID)})
	}
	if b.Datestamp != "" {
		base = append(base, kafkago.Header{Key: HeaderDatestamp, Value: []byte(b.Datestamp)})
	}
	if b.SeqNum >= 0 {
		base = append(base, kafkago.Header{Key: HeaderSeqNum, Value: []byte(strconv.FormatInt(b.SeqNum, 10))})
	}
	t := time.Unix(0, b.ReceivedUnixNano)
	per := len(base) + 2
	headers := make([]kafkago.Header, per*len(b.Records))
	digits := len(strconv.Itoa(b.RecordIndex(len(b.Records) - 1)))
	idLen := len(appendRecordID(nil, b, len(b.Records)-1, hash))
	buf := make([]byte, 0, len(b.Records)*(digits+idLen+8))
	for i, r := range b.Records {
		h := headers[i*per : (i+1)*per : (i+1)*per]
		copy(h, base)
		start := len(buf)
		buf = strconv.AppendInt(buf, int64(b.RecordIndex(i)), 10)
		h[per-2] = kafkago.Header{Key: HeaderRecordIndex, Value: buf[start:len(buf):len(buf)]}
		start = len(buf)
		buf = appendRecordID(buf, b, i, hash)
		h[per-1] = kafkago.Header{Key: HeaderRecordID, Value: buf[start:len(buf):len(buf)]}
		msgs = append(msgs, kafkago.Message{Key: key, Value: r, Headers: h, Time: t})
	}
	return msgs
}
