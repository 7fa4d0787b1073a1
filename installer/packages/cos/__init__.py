"""Google's published COS GPU artifacts: bucket layout, Cloud Storage hashes, assembly.

`layout` names every object (cos-tools' `src/pkg/cos/artifacts.go` and cos_gpu_installer's
`internal/installer/installer.go`), `gcshash` checks a download against the `x-goog-hash`
header Cloud Storage sends (no sha256 is published for these files), and `assemble` turns
the signed prebuilt modules and NVIDIA's runfile into an ordinary driver package.
"""
