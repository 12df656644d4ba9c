// Package version holds the build's version, stamped by `make build` with
// -ldflags "-X github.com/edgepipe/edgepipe/internal/version.Version=…"
// (and Revision, BuildDate). Unstamped builds (go run, go test) report "dev".
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set at link time by the Makefile; never assigned at run time.
var (
	// Version is the release version, e.g. "v0.3.0" or a git describe string.
	Version = "dev"
	// Revision is the git commit the binary was built from.
	Revision = ""
	// BuildDate is the UTC build time in RFC 3339.
	BuildDate = ""
)

// Info describes one build, for logs, --version and build-info metrics.
type Info struct {
	Version   string
	Revision  string
	BuildDate string
	GoVersion string
}

// Get returns the stamped build information. When the binary was not stamped
// it falls back to the module version and VCS revision Go embedded, if any.
func Get() Info {
	info := Info{Version: Version, Revision: Revision, BuildDate: BuildDate, GoVersion: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if info.Version == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			info.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && info.Revision == "" {
				info.Revision = s.Value
			}
		}
	}
	return info
}

// String renders the information for --version output, e.g.
// "exporter v0.3.0 (revision 1a2b3c, built 2026-11-23T04:00:00Z, go1.26.8)".
func (i Info) String() string {
	return fmt.Sprintf("%s (revision %s, built %s, %s)", i.Version, orUnknown(i.Revision), orUnknown(i.BuildDate), i.GoVersion)
}

// Print returns the --version line for a program.
func Print(program string) string {
	return program + " " + Get().String()
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}
