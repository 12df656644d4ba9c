package deploytest

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/edgepipe/edgepipe/internal/testenv"
)

// TestChartPreflight: exporter.preflight.enabled and receiver.preflight.enabled
// (off by default) start each pod with an init container "check" running
// `<program> check` with exactly the arguments, variables (the exporter's
// GOMEMLIMIT of its own container aside) and volume mounts of the
// program's container, in the same image and security context.
func TestChartPreflight(t *testing.T) {
	for key, w := range render(t).workloads(t) {
		if n := len(w.Spec.Template.Spec.InitContainers); n != 0 {
			t.Errorf("%s: %d init containers with the default values", key, n)
		}
	}
	m := render(t, chartDir+"/ci/production-values.yaml", "testdata/preflight.yaml")
	for key, w := range m.workloads(t) {
		ps := w.Spec.Template.Spec
		if len(ps.InitContainers) != 1 || ps.InitContainers[0].Name != "check" {
			t.Fatalf("%s: init containers %+v, want one named check", key, ps.InitContainers)
		}
		ic, c := ps.InitContainers[0], ps.Containers[0]
		if want := append([]string{"check"}, c.Args...); !slices.Equal(ic.Args, want) {
			t.Errorf("%s: check args %q, want %q", key, ic.Args, want)
		}
		if ic.Image != c.Image || !slices.Equal(ic.Command, c.Command) || !reflect.DeepEqual(ic.SecurityContext, c.SecurityContext) ||
			!reflect.DeepEqual(ic.VolumeMounts, c.VolumeMounts) || !reflect.DeepEqual(ic.Resources, c.Resources) {
			t.Errorf("%s: check container %+v differs from %+v beyond args and env", key, ic, c)
		}
		var want []envVar
		for _, e := range c.Env {
			if e.Name != "GOMEMLIMIT" || e.ValueFrom == nil { // a resourceFieldRef names its container
				want = append(want, e)
			}
		}
		if !reflect.DeepEqual(ic.Env, want) {
			t.Errorf("%s: check env %+v, want %+v", key, ic.Env, want)
		}
	}
}

// TestChartPreflightRuns runs the init containers' command lines as the
// chart renders them (switched to the built-in simulator, with the test's
// ClickHouse 18.16, kfake and OTLP receiver in place of the production
// ones): every check passes, so a flag the check does not take, a variable
// or file it lacks, fails here instead of in a pod stuck in Init.
func TestChartPreflightRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the programs")
	}
	svc := newServices(t)
	for _, tc := range []struct {
		name   string
		values []string
	}{
		{"production", []string{chartDir + "/ci/production-values.yaml", "testdata/simulate.yaml", "testdata/preflight.yaml"}},
		{"web config TLS", []string{chartDir + "/ci/webconfig-values.yaml", "testdata/simulate.yaml", "testdata/preflight.yaml"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := render(t, tc.values...)
			for key, w := range m.workloads(t) {
				ps := w.Spec.Template.Spec
				if len(ps.InitContainers) != 1 {
					t.Fatalf("%s: %d init containers", key, len(ps.InitContainers))
				}
				bin, args, environ := svc.commandLine(t, m, key, ps, ps.InitContainers[0], testenv.FreeAddr(t))
				stdout, stderr, code := testenv.RunCommandEnv(t, bin, args, environ)
				if code != 0 || !strings.Contains(stdout, " 0 failed, 0 skipped\n") {
					t.Errorf("%s: %s %s: exit %d\nstdout:\n%s\nstderr:\n%s", key, bin, strings.Join(args, " "), code, stdout, stderr)
				}
			}
		})
	}
}
