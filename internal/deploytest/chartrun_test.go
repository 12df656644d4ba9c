package deploytest

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgepipe/edgepipe/internal/sinks/otel/otlptest"
	"github.com/edgepipe/edgepipe/internal/testenv"
)

// TestChartCommandLinesRun starts the real programs with exactly the command
// lines and environment the chart renders for the production values (sharded
// exporter with ClickHouse and OTLP, receiver with Kafka and ClickHouse),
// switched to the built-in simulator. Only what points outside the test is
// replaced: listen addresses, volume paths, the sinks' addresses, credential
// values from Secrets and downward-API values. Both must become ready, so a
// flag or variable the programs do not know, or a value they reject, fails
// here instead of in a crash-looping pod.
func TestChartCommandLinesRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the programs")
	}
	m := render(t, chartDir+"/ci/production-values.yaml", "testdata/simulate-production.yaml")
	bins := buildCommands(t, "exporter", "rtld-receiver")
	ch := testenv.ClickHouse(t)
	kafka := testenv.Kafka(t)
	_, otlpAddr := otlptest.StartGRPC(t)

	ws := m.workloads(t)
	if len(ws) != 2 {
		t.Fatalf("%d workloads, want 2", len(ws))
	}
	type program struct {
		name, readyz string
		exited       <-chan struct{}
	}
	var programs []program
	for key, w := range ws {
		c := w.Spec.Template.Spec.Containers[0]
		if len(c.Command) != 1 {
			t.Fatalf("%s: command %v", key, c.Command)
		}
		bin, ok := bins[filepath.Base(c.Command[0])]
		if !ok {
			t.Fatalf("%s: runs %s, which is none of the built commands", key, c.Command[0])
		}
		tmp := t.TempDir()

		env := map[string]string{}
		for _, ev := range c.Env {
			switch {
			case ev.Value != nil:
				env[ev.Name] = *ev.Value
			case ev.ValueFrom == nil:
				t.Fatalf("%s: env %s has neither value nor valueFrom", key, ev.Name)
			case ev.ValueFrom.SecretKeyRef != nil:
				switch ev.Name {
				case "EDGEPIPE_CLICKHOUSE_DSN":
					env[ev.Name] = ch.DSN(ch.NewDatabase(t))
				case "EDGEPIPE_CLICKHOUSE_PASSWORD":
					// optional key, absent from the Secret
				default:
					env[ev.Name] = "value-of-" + ev.ValueFrom.SecretKeyRef.Key
				}
			case ev.ValueFrom.FieldRef != nil && ev.ValueFrom.FieldRef.FieldPath == "metadata.labels['apps.kubernetes.io/pod-index']":
				env[ev.Name] = "1" // the second replica
			case ev.ValueFrom.ResourceFieldRef != nil && ev.ValueFrom.ResourceFieldRef.Resource == "limits.memory":
				n, err := quantityBytes(c.Resources.Limits["memory"])
				if err != nil {
					t.Fatalf("%s: %s: %v", key, ev.Name, err)
				}
				env[ev.Name] = strconv.FormatInt(n, 10) // what the kubelet passes
			default:
				t.Fatalf("%s: env %s: unsupported valueFrom %+v", key, ev.Name, *ev.ValueFrom)
			}
		}
		if _, ok := env["EDGEPIPE_KAFKA_BROKERS"]; ok {
			env["EDGEPIPE_KAFKA_BROKERS"] = kafka.Addr()
		}

		addr := testenv.FreeAddr(t)
		var mounts []string
		for _, vm := range c.VolumeMounts {
			mounts = append(mounts, vm.MountPath, filepath.Join(tmp, "volume-"+vm.Name))
		}
		volumes := strings.NewReplacer(mounts...)
		var args []string
		for _, a := range c.Args {
			// $(VAR) as Kubernetes expands it.
			a = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`).ReplaceAllStringFunc(a, func(ref string) string {
				name := ref[2 : len(ref)-1]
				if v, ok := env[name]; ok {
					return v
				}
				t.Errorf("%s: %s refers to undefined %s", key, a, name)
				return ref
			})
			switch {
			case strings.HasPrefix(a, "--web.listen-address="):
				a = "--web.listen-address=" + addr
			case strings.HasPrefix(a, "--otlp.endpoint="):
				a = "--otlp.endpoint=http://" + otlpAddr
			}
			args = append(args, volumes.Replace(a))
		}
		environ := []string{"HOME=" + tmp, "TMPDIR=" + tmp, "PATH=" + os.Getenv("PATH")}
		for k, v := range env {
			environ = append(environ, k+"="+v)
		}
		t.Logf("%s: %s %s", key, filepath.Base(bin), strings.Join(args, " "))
		exited := startProgramEnv(t, bin, environ, args...)
		programs = append(programs, program{key, "http://" + addr + "/readyz", exited})
	}
	for _, p := range programs {
		u := p.readyz
		waitFor(t, 2*time.Minute, func(ctx context.Context) error {
			select {
			case <-p.exited:
				t.Fatalf("%s exited instead of becoming ready (log below)", p.name)
			default:
			}
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
			if err != nil {
				return err
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("%s: %s", u, resp.Status)
			}
			return nil
		})
	}
}
