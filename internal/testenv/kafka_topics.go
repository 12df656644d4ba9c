package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// SetTopicConfig sets a config of topic while the broker runs, the way an
// operator does with `kafka-configs.sh --alter --entity-type topics
// --entity-name <topic> --add-config key=value` (an
// IncrementalAlterConfigs request), for example max.message.bytes.
func (k *KafkaBroker) SetTopicConfig(t testing.TB, topic, key, value string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	rr := kmsg.NewIncrementalAlterConfigsRequestResource()
	rr.ResourceType, rr.ResourceName = kmsg.ConfigResourceTypeTopic, topic
	rc := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	rc.Name, rc.Value, rc.Op = key, kmsg.StringPtr(value), kmsg.IncrementalAlterConfigOpSet
	rr.Configs = append(rr.Configs, rc)
	req.Resources = append(req.Resources, rr)
	resp, err := req.RequestWith(ctx, k.Client(t))
	if err != nil {
		t.Fatalf("testenv: set config %s=%s of topic %s: %v", key, value, topic, err)
	}
	for _, r := range resp.Resources {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			t.Fatalf("testenv: set config %s=%s of topic %s: %v", key, value, topic, err)
		}
	}
}
