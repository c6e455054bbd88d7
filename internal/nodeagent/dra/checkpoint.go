package dra

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/internal/atomicfile"
	"github.com/tessera-gpu/tessera/internal/limiterconf"
)

// checkpointVersion is the layout of the checkpoint file; a file of
// another version is refused (the agent then does not start the driver:
// unpreparing claims it cannot read would leave their files behind).
const checkpointVersion = 1

// Prepared is one prepared claim: what the kubelet was told and every file
// written for it, so a restarted agent answers the same and unprepare
// removes exactly these.
type Prepared struct {
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	UID       types.UID `json:"uid"`
	Grants    []Grant   `json:"grants"`
	// Requests are the claim's requests this driver serves, one CDI
	// device each.
	Requests []PreparedRequest `json:"requests"`
	// Spec is the CDI spec file's name in the CDI directory.
	Spec     string    `json:"spec"`
	Prepared time.Time `json:"prepared"`
}

// PreparedRequest is one request of a prepared claim.
type PreparedRequest struct {
	Request string `json:"request"`
	// CDIDevice is the fully qualified CDI device ID the containers get.
	CDIDevice string `json:"cdiDevice"`
	// Dir is the host directory of the request's limiter files (state/
	// and limiter.conf); empty when the limiter does not apply.
	Dir string `json:"dir,omitempty"`
	// Confirm is the host path of the driver-held memory limits'
	// confirmation (memlimits), when the driver holds them; "" otherwise.
	Confirm string `json:"confirm,omitempty"`
}

// Borrower is the request's name in the GPU budget files: the containers
// that use it share one grant, so they borrow as one.
func Borrower(uid types.UID, request string) string {
	return limiterconf.BorrowerName("claim/" + string(uid) + "/" + request)
}

// StateFile is the limiter's shared-state file of the request on the host
// (what its containers see at their state directory); "" when the limiter
// does not apply.
func (r PreparedRequest) StateFile() string {
	if r.Dir == "" {
		return ""
	}
	return filepath.Join(r.Dir, stateName, stateFile)
}

type checkpointFile struct {
	Version int                     `json:"version"`
	Claims  map[types.UID]*Prepared `json:"claims"`
}

// loadCheckpoint reads the checkpoint; a missing file is an empty one.
func loadCheckpoint(path string) (map[types.UID]*Prepared, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return map[types.UID]*Prepared{}, nil
	}
	if err != nil {
		return nil, err
	}
	var f checkpointFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	if f.Version != checkpointVersion {
		return nil, fmt.Errorf("checkpoint %s: version %d, this agent reads %d", path, f.Version, checkpointVersion)
	}
	if f.Claims == nil {
		f.Claims = map[types.UID]*Prepared{}
	}
	for uid, p := range f.Claims {
		if p == nil || p.UID != uid {
			return nil, fmt.Errorf("checkpoint %s: entry %s names claim %v", path, uid, p)
		}
	}
	return f.Claims, nil
}

// saveCheckpoint replaces the checkpoint atomically.
func saveCheckpoint(path string, claims map[types.UID]*Prepared) error {
	b, err := json.MarshalIndent(checkpointFile{Version: checkpointVersion, Claims: claims}, "", " ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return atomicfile.Write(path, b, 0o600)
}
