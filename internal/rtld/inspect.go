package rtld

import (
	"context"
	"fmt"
	"net/url"
)

// ProfileState is what the platform holds of the receiver's profile in
// one environment.
type ProfileState struct {
	// Found reports whether a profile named ProfileName exists, and Copies
	// how many do (the registrar deletes all but the oldest).
	Found  bool
	Copies int
	// Destination is its destination_endpoint, and Delivers whether that
	// is this receiver's (Registrar.Destination); Enabled whether it is on.
	Destination string
	Delivers    bool
	Enabled     bool
}

// Inspect lists environmentID's profiles and reports the receiver's, with
// GET requests only: unlike a check of Run, it neither creates, repairs
// nor deletes anything. An unknown environment is the platform's error.
func (r *Registrar) Inspect(ctx context.Context, environmentID string) (ProfileState, error) {
	all, err := listAllRTLD[remoteProfile](ctx, r.api, profilesPath, url.Values{"environment_id": {environmentID}})
	if err != nil {
		return ProfileState{}, fmt.Errorf("list the profiles of environment %s: %w", environmentID, err)
	}
	var st ProfileState
	var oldest int64
	for _, p := range all {
		if p.ProfileName != r.cfg.ProfileName {
			continue
		}
		st.Copies++
		if st.Found && p.ID > oldest {
			continue
		}
		st.Found, oldest = true, p.ID
		st.Destination, st.Enabled = p.DeliveryMethod.DestinationEndpoint, p.Enabled
	}
	st.Delivers = st.Found && st.Destination == r.Destination(environmentID)
	return st, nil
}
