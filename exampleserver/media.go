package exampleserver

import (
	"bytes"
	"encoding/binary"
	"image"
	"image/color"
	"image/png"
)

// redPixelPNG is a valid 1×1 red PNG, encoded once at start-up.
var redPixelPNG = func() []byte {
	img := image.NewRGBA(image.Rect(0, 0, 1, 1))
	img.Set(0, 0, color.RGBA{R: 0xff, A: 0xff})
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		panic("exampleserver: encoding PNG: " + err.Error()) // cannot happen for an in-memory RGBA image
	}
	return buf.Bytes()
}()

// silentWAV is a valid RIFF/WAVE file: 8 kHz, mono, 8-bit PCM, 100 samples
// of silence.
var silentWAV = func() []byte {
	const (
		sampleRate = 8000
		channels   = 1
		bits       = 8
		samples    = 100
	)
	var buf bytes.Buffer
	w := func(v any) { _ = binary.Write(&buf, binary.LittleEndian, v) } // bytes.Buffer writes cannot fail
	buf.WriteString("RIFF")
	w(uint32(36 + samples))
	buf.WriteString("WAVEfmt ")
	w(uint32(16))                               // fmt chunk size
	w(uint16(1))                                // PCM
	w(uint16(channels))                         //
	w(uint32(sampleRate))                       //
	w(uint32(sampleRate * channels * bits / 8)) // byte rate
	w(uint16(channels * bits / 8))              // block align
	w(uint16(bits))                             //
	buf.WriteString("data")
	w(uint32(samples))
	buf.Write(bytes.Repeat([]byte{0x80}, samples)) // 8-bit PCM silence is 128
	return buf.Bytes()
}()
