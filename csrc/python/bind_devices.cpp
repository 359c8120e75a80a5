// bind_devices.cpp - the device backends for Python: the Device interface,
// HostDevice (host memory, no streams) and SimDevice (simulated streams and
// events, for tests). See bind.h.
#include <pybind11/stl.h>

#include <memory>

#include "core/device.h"
#include "core/host_device.h"
#include "core/sim_device.h"
#include "python/bind.h"

namespace py = pybind11;

namespace renaissance {

void bind_devices(py::module_& m) {
  py::class_<Device, std::shared_ptr<Device>>(m, "Device")
      .def_property_readonly("name", &Device::name)
      .def_property_readonly("alignment", &Device::alignment)
      .def_property_readonly("is_device_memory", &Device::is_device_memory)
      .def("create_event", &Device::create_event)
      .def("destroy_event", &Device::destroy_event, py::arg("event"))
      .def("record_event", &Device::record_event, py::arg("event"), py::arg("stream"))
      .def("query_event", &Device::query_event, py::arg("event"))
      .def("synchronize_event", &Device::synchronize_event, py::arg("event"))
      .def("stream_wait_event", &Device::stream_wait_event, py::arg("stream"), py::arg("event"));

  py::class_<HostDevice, Device, std::shared_ptr<HostDevice>>(m, "HostDevice").def(py::init<>());

  py::class_<SimWait>(m, "SimWait")
      .def_readonly("stream", &SimWait::stream)
      .def_readonly("event", &SimWait::event)
      .def_readonly("event_stream", &SimWait::event_stream)
      .def_readonly("event_position", &SimWait::event_position);

  py::class_<SimDevice, Device, std::shared_ptr<SimDevice>>(m, "SimDevice")
      .def(py::init<std::size_t, std::size_t>(), py::arg("capacity_bytes") = 0,
           py::arg("alignment") = 512)
      .def("new_stream", &SimDevice::new_stream)
      .def_property_readonly("num_streams", &SimDevice::num_streams)
      .def("enqueue", &SimDevice::enqueue, py::arg("stream"), py::arg("units") = 1)
      .def("advance", &SimDevice::advance, py::arg("stream"), py::arg("units"))
      .def("run_all", &SimDevice::run_all)
      .def("enqueued", &SimDevice::enqueued)
      .def("completed", &SimDevice::completed)
      .def("waits", &SimDevice::waits)
      .def_property_readonly("events_recorded", &SimDevice::events_recorded)
      .def_property_readonly("event_queries", &SimDevice::event_queries)
      .def_property_readonly("host_synchronizations", &SimDevice::host_synchronizations)
      .def_property_readonly("live_events", &SimDevice::live_events)
      .def_property_readonly("used_bytes", &SimDevice::used_bytes)
      .def("set_address_ranges", &SimDevice::set_address_ranges);
}

}  // namespace renaissance
