package deploytest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// The few Kubernetes object fields the chart tests assert on. Decoding into
// these types (rather than k8s.io/api) keeps the test module small; unknown
// fields are ignored.

type objectMeta struct {
	Name        string            `yaml:"name"`
	Namespace   string            `yaml:"namespace"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

// object is one rendered manifest: its typed header and the raw document.
type object struct {
	APIVersion string     `yaml:"apiVersion"`
	Kind       string     `yaml:"kind"`
	Metadata   objectMeta `yaml:"metadata"`

	node *yaml.Node // the whole document
	text string     // the document as rendered
}

// decode decodes the object's document into v.
func (o object) decode(t *testing.T, v any) {
	t.Helper()
	if err := o.node.Decode(v); err != nil {
		t.Fatalf("decode %s %s: %v", o.Kind, o.Metadata.Name, err)
	}
}

type workload struct {
	Spec struct {
		Replicas    *int   `yaml:"replicas"`
		ServiceName string `yaml:"serviceName"`
		Selector    struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		Template struct {
			Metadata objectMeta `yaml:"metadata"`
			Spec     podSpec    `yaml:"spec"`
		} `yaml:"template"`
		VolumeClaimTemplates []struct {
			Metadata objectMeta `yaml:"metadata"`
			Spec     struct {
				AccessModes      []string `yaml:"accessModes"`
				StorageClassName string   `yaml:"storageClassName"`
				Resources        struct {
					Requests map[string]string `yaml:"requests"`
				} `yaml:"resources"`
			} `yaml:"spec"`
		} `yaml:"volumeClaimTemplates"`
		PersistentVolumeClaimRetentionPolicy map[string]string `yaml:"persistentVolumeClaimRetentionPolicy"`
		Strategy                             struct {
			Type string `yaml:"type"`
		} `yaml:"strategy"`
	} `yaml:"spec"`
}

type podSpec struct {
	ServiceAccountName            string          `yaml:"serviceAccountName"`
	AutomountServiceAccountToken  *bool           `yaml:"automountServiceAccountToken"`
	TerminationGracePeriodSeconds *int            `yaml:"terminationGracePeriodSeconds"`
	SecurityContext               securityContext `yaml:"securityContext"`
	Containers                    []container     `yaml:"containers"`
	InitContainers                []container     `yaml:"initContainers"`
	Volumes                       []struct {
		Name   string `yaml:"name"`
		Secret *struct {
			SecretName string `yaml:"secretName"`
		} `yaml:"secret"`
		ConfigMap *struct {
			Name string `yaml:"name"`
		} `yaml:"configMap"`
		EmptyDir              map[string]any `yaml:"emptyDir"`
		PersistentVolumeClaim map[string]any `yaml:"persistentVolumeClaim"`
	} `yaml:"volumes"`
}

type securityContext struct {
	RunAsNonRoot             *bool  `yaml:"runAsNonRoot"`
	RunAsUser                *int64 `yaml:"runAsUser"`
	RunAsGroup               *int64 `yaml:"runAsGroup"`
	ReadOnlyRootFilesystem   *bool  `yaml:"readOnlyRootFilesystem"`
	AllowPrivilegeEscalation *bool  `yaml:"allowPrivilegeEscalation"`
	Privileged               *bool  `yaml:"privileged"`
	Capabilities             struct {
		Add  []string `yaml:"add"`
		Drop []string `yaml:"drop"`
	} `yaml:"capabilities"`
	SeccompProfile struct {
		Type string `yaml:"type"`
	} `yaml:"seccompProfile"`
}

type container struct {
	Name    string   `yaml:"name"`
	Image   string   `yaml:"image"`
	Command []string `yaml:"command"`
	Args    []string `yaml:"args"`
	Env     []envVar `yaml:"env"`
	EnvFrom []struct {
		SecretRef    *struct{ Name string } `yaml:"secretRef"`
		ConfigMapRef *struct{ Name string } `yaml:"configMapRef"`
	} `yaml:"envFrom"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	LivenessProbe  *probe `yaml:"livenessProbe"`
	ReadinessProbe *probe `yaml:"readinessProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext securityContext `yaml:"securityContext"`
	VolumeMounts    []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		ReadOnly  bool   `yaml:"readOnly"`
	} `yaml:"volumeMounts"`
}

type envVar struct {
	Name      string  `yaml:"name"`
	Value     *string `yaml:"value"`
	ValueFrom *struct {
		SecretKeyRef *struct {
			Name     string `yaml:"name"`
			Key      string `yaml:"key"`
			Optional bool   `yaml:"optional"`
		} `yaml:"secretKeyRef"`
		FieldRef *struct {
			FieldPath string `yaml:"fieldPath"`
		} `yaml:"fieldRef"`
		ResourceFieldRef *struct {
			Resource string `yaml:"resource"`
		} `yaml:"resourceFieldRef"`
	} `yaml:"valueFrom"`
}

// env returns the container's variable name, or nil.
func (c container) env(name string) *envVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

// hasArg reports whether arg is one of the container's arguments.
func (c container) hasArg(arg string) bool {
	for _, a := range c.Args {
		if a == arg {
			return true
		}
	}
	return false
}

// argValue returns the value of --name=value among the arguments.
func (c container) argValue(name string) (string, bool) {
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v, true
		}
	}
	return "", false
}

type probe struct {
	HTTPGet *struct {
		Path   string `yaml:"path"`
		Port   any    `yaml:"port"`
		Scheme string `yaml:"scheme"`
	} `yaml:"httpGet"`
	TCPSocket *struct {
		Port any `yaml:"port"`
	} `yaml:"tcpSocket"`
}

type service struct {
	Spec struct {
		Type      string            `yaml:"type"`
		ClusterIP string            `yaml:"clusterIP"`
		Selector  map[string]string `yaml:"selector"`
		Ports     []servicePort     `yaml:"ports"`
	} `yaml:"spec"`
}

type servicePort struct {
	Name       string `yaml:"name"`
	Port       int    `yaml:"port"`
	TargetPort any    `yaml:"targetPort"`
}

// parseManifests splits helm template output into objects.
func parseManifests(out []byte) ([]object, error) {
	var objs []object
	dec := yaml.NewDecoder(bytes.NewReader(out))
	for {
		var node yaml.Node
		err := dec.Decode(&node)
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("parse rendered YAML: %w", err)
		}
		if len(node.Content) == 0 || node.Content[0].Kind != yaml.MappingNode {
			continue // an empty document
		}
		var o object
		if err := node.Decode(&o); err != nil {
			return nil, fmt.Errorf("decode object header: %w", err)
		}
		if o.Kind == "" {
			return nil, fmt.Errorf("document without kind: %v", node.Content[0])
		}
		text, err := yaml.Marshal(&node)
		if err != nil {
			return nil, fmt.Errorf("re-encode %s %s: %w", o.Kind, o.Metadata.Name, err)
		}
		o.node = &node
		o.text = string(text)
		objs = append(objs, o)
	}
}

// manifests is a rendered chart.
type manifests []object

func (m manifests) ofKind(kind string) []object {
	var out []object
	for _, o := range m {
		if o.Kind == kind {
			out = append(out, o)
		}
	}
	return out
}

func (m manifests) get(t *testing.T, kind, name string) object {
	t.Helper()
	for _, o := range m {
		if o.Kind == kind && o.Metadata.Name == name {
			return o
		}
	}
	t.Fatalf("no %s named %q rendered; have %v", kind, name, m.names())
	return object{}
}

func (m manifests) names() []string {
	out := make([]string, len(m))
	for i, o := range m {
		out[i] = o.Kind + "/" + o.Metadata.Name
	}
	return out
}

// workloads returns every Deployment and StatefulSet decoded.
func (m manifests) workloads(t *testing.T) map[string]workload {
	t.Helper()
	out := map[string]workload{}
	for _, o := range m {
		if o.Kind != "Deployment" && o.Kind != "StatefulSet" {
			continue
		}
		var w workload
		o.decode(t, &w)
		out[o.Kind+"/"+o.Metadata.Name] = w
	}
	return out
}

// selects reports whether every selector label is among labels.
func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}
