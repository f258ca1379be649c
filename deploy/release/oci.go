package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Where the image holds its files, and how it starts: `tierlimit run` with
// the policy file, to which the DaemonSet adds --iface and --metrics-addr.
const (
	imageBinary  = "usr/bin/tierlimit"
	imagePolicy  = "etc/tierlimit/policy.yaml"
	imageRefName = "org.opencontainers.image.ref.name"
	metricsPort  = "9713/tcp"
)

// buildImage writes the OCI image layout dist/oci (an index with one image
// per architecture, tagged with the version) and, per architecture, a
// tarball that `docker load` and `podman load` accept. Each image is one
// layer on an empty base: the static binary and the default policy.
func buildImage(s spec) ([]string, error) {
	policy, err := os.ReadFile(s.repoFile("tiers/default.yaml"))
	if err != nil {
		return nil, err
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	var outs []string
	for _, arch := range s.Arches {
		img, err := archImage(s, arch, policy)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", arch, err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}},
		})
		tag, err := name.NewTag("tierlimit:" + s.Version)
		if err != nil {
			return nil, fmt.Errorf("tag for version %q: %w", s.Version, err)
		}
		out := filepath.Join(s.Dist, fmt.Sprintf("tierlimit_%s_%s.image.tar", s.Version, arch))
		if err := tarball.WriteToFile(out, tag, img); err != nil {
			return nil, err
		}
		outs = append(outs, out)
	}
	dir := filepath.Join(s.Dist, "oci")
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return nil, err
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{imageRefName: s.Version})); err != nil {
		return nil, err
	}
	return append(outs, dir), nil
}

// archImage is the image for one architecture.
func archImage(s spec, arch string, policy []byte) (v1.Image, error) {
	bin, err := os.ReadFile(s.binary(arch))
	if err != nil {
		return nil, fmt.Errorf("binary: %w (run make release)", err)
	}
	layerTar, err := layerTar([]tarFile{
		{name: "etc/", mode: 0o755, dir: true},
		{name: "etc/tierlimit/", mode: 0o755, dir: true},
		{name: imagePolicy, mode: 0o644, body: policy},
		{name: "run/", mode: 0o755, dir: true},
		{name: "run/tierlimit/", mode: 0o755, dir: true},
		{name: "sys/", mode: 0o555, dir: true},
		{name: "tmp/", mode: 0o1777, dir: true},
		{name: "usr/", mode: 0o755, dir: true},
		{name: "usr/bin/", mode: 0o755, dir: true},
		{name: imageBinary, mode: 0o755, body: bin},
	})
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	cf.Config = v1.Config{
		Entrypoint:   []string{"/" + imageBinary},
		Cmd:          []string{"run", "--config", "/" + imagePolicy},
		ExposedPorts: map[string]struct{}{metricsPort: {}},
		Labels: map[string]string{
			"org.opencontainers.image.title":    "tierlimit",
			"org.opencontainers.image.version":  s.Version,
			"org.opencontainers.image.revision": s.Commit,
			"org.opencontainers.image.licenses": "MIT",
		},
	}
	return mutate.ConfigFile(img, cf)
}

// tarFile is a file or directory of a layer, owned by root.
type tarFile struct {
	name string
	mode int64
	dir  bool
	body []byte
}

// layerTar returns the uncompressed tar of files, in order, with a fixed
// mtime so that the same inputs make the same layer digest.
func layerTar(files []tarFile) ([]byte, error) {
	var b bytes.Buffer
	w := tar.NewWriter(&b)
	for _, f := range files {
		h := &tar.Header{Name: f.name, Mode: f.mode, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		if f.dir {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag = tar.TypeReg
			h.Size = int64(len(f.body))
		}
		if err := w.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("layer: %s: %w", f.name, err)
		}
		if _, err := w.Write(f.body); err != nil {
			return nil, fmt.Errorf("layer: %s: %w", f.name, err)
		}
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
