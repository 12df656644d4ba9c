package ociimage

import (
	"debug/elf"
	"fmt"
	"os"
)

// goarch names the architectures the image can be built for, by ELF
// machine and byte order, as Go and the OCI spec spell them.
var goarch = map[elf.Machine]map[elf.Data]string{
	elf.EM_X86_64:  {elf.ELFDATA2LSB: "amd64"},
	elf.EM_AARCH64: {elf.ELFDATA2LSB: "arm64"},
	elf.EM_ARM:     {elf.ELFDATA2LSB: "arm"},
	elf.EM_386:     {elf.ELFDATA2LSB: "386"},
	elf.EM_PPC64:   {elf.ELFDATA2LSB: "ppc64le"},
	elf.EM_S390:    {elf.ELFDATA2MSB: "s390x"},
	elf.EM_RISCV:   {elf.ELFDATA2LSB: "riscv64"},
}

// staticArch returns the architecture of the Linux executable at path, and
// an error unless it is statically linked: the image has no C library, so
// a program that needs one would fail only when started, in a user's
// cluster.
func staticArch(path string) (string, error) {
	file, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer file.Close()
	f, err := elf.NewFile(file)
	if err != nil {
		return "", fmt.Errorf("%s is not a Linux executable: %w", path, err)
	}
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return "", fmt.Errorf("%s is not an executable (ELF type %s)", path, f.Type)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return "", fmt.Errorf("%s is dynamically linked (it needs a program interpreter): build it with CGO_ENABLED=0, as `make build` does", path)
		}
	}
	if libs, err := f.ImportedLibraries(); err == nil && len(libs) > 0 {
		return "", fmt.Errorf("%s needs shared libraries %v: build it with CGO_ENABLED=0, as `make build` does", path, libs)
	}
	arch, ok := goarch[f.Machine][f.Data]
	if !ok {
		return "", fmt.Errorf("%s: unsupported architecture %s (%s)", path, f.Machine, f.Data)
	}
	return arch, nil
}
